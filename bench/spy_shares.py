"""Where a sampled router's Python time goes (issue #27): read a py-spy ``--format raw``
profile (one ``frame;frame;... count`` line per stack) and print, per function named, the
samples whose stack holds it (inclusive, each stack counted once per function) and what that is
per request, or one function's callees.

Samples whose innermost frame is the event loop's ``Runner.run`` (uvloop waiting, or its C
code between Python callbacks) and those of other threads (executors, cache maintenance) are
left out: what remains is the main thread running Python, where ``py-spy`` attributes a C call
(a ``write``, a ``set_result``) to the Python frame that made it. The sampler is not in the
product and changes nothing in the process (``--nonblocking``: it does not stop it).

``python -m bench.spy_shares PROFILE --rate 1000 --requests 2500 [--frames A,B,...]
[--callees FRAME]``
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

_IDLE = "Runner.run"
_LOCATION = re.compile(r" \((.*?)(:\d+)?\)$")


def stacks(path: Path) -> Iterator[tuple[list[str], list[str], int]]:
    """Each main-thread Python stack: function names, names with their file, and count."""
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_LOCATION.sub(r" (\1)", f) for f in stack.split(";")]
        names = [_LOCATION.sub("", f) for f in frames]
        if not names or names[-1] == _IDLE or any("_bootstrap" in n for n in names[:3]):
            continue
        yield names, frames, int(count)


def inclusive(path: Path) -> tuple[Counter[str], int]:
    """Samples per function (a stack counted once per function in it) and the total."""
    shares: Counter[str] = Counter()
    total = 0
    for names, _, count in stacks(path):
        total += count
        for name in set(names):
            shares[name] += count
    return shares, total


def callees(path: Path, frame: str) -> Counter[str]:
    """Samples under ``frame`` by its callee (``<self>``: in the frame itself)."""
    out: Counter[str] = Counter()
    for names, frames, count in stacks(path):
        if frame in names:
            at = names.index(frame)
            out[frames[at + 1] if at + 1 < len(frames) else "<self>"] += count
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.spy_shares", description=__doc__)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--rate", type=float, required=True, help="py-spy's --rate (samples/s)")
    parser.add_argument("--requests", type=int, required=True, help="requests in the window")
    parser.add_argument("--frames", default="", help="comma-separated functions (default: top 60)")
    parser.add_argument("--callees", default="", help="a function whose callees to list")
    args = parser.parse_args()
    per_request_us = 1e6 / args.rate / args.requests  # one sample's share of a request
    if args.callees:
        for name, count in callees(args.profile, args.callees).most_common(25):
            print(f"{count:6d} {count * per_request_us:7.1f} us/req  {name}")
        return
    shares, total = inclusive(args.profile)
    print(f"main-thread Python samples: {total} ({total * per_request_us:.0f} us per request)")
    names = args.frames.split(",") if args.frames else [n for n, _ in shares.most_common(60)]
    for name in names:
        count = shares[name]
        print(f"{100 * count / max(total, 1):5.1f}% {count * per_request_us:7.1f} us/req  {name}")


if __name__ == "__main__":
    main()
