"""Precise prefix scoring with generated blocks: what the KV-event tracker learns, replayed.

One simulated engine (the simulator's own :class:`PrefixCache`, whose stores and evictions are
the KV events the simulator publishes) and the router's :class:`KvEventTracker` fed those
events, over multi-turn chats: tenants with a system prompt, conversations whose next turn is
the history (the prompt and its answer) and a new message. Per step one request is routed
(what each index claims the engine holds is read then), sent (``note_dispatch``, and the
approximate index records it as the router does), the previous request is admitted (its prompt's
blocks stored) and the one before ``--running`` more leaves (its prompt's and answer's blocks
stored), so a request is always pending while another one's answer is stored.

``--answers engine``: a turn's history holds the engine's own answer (a chat client's case: the
next turn hits the answer's blocks); ``synthetic``: another text of the same length (the bench
scenario's case: no engine holds it). ``--tracker FILE`` loads ``KvEventTracker`` from another
copy of ``kv_tracker.py`` (an A/B against another branch).

``approx+answer`` is the approximate index also told each answer (the prompt and the answer's
router blocks recorded when the stream ends), which the router would learn if it decoded the
answers it relays (it does not); ``approx-evicted`` the tracker's
approximate index (until 2026-11-27 (f), less the router blocks the events said were evicted;
since, bounded (LRU) to the engine's capacity once the events revealed it, removals not applied);
``approx-sized`` the approximate index bounded (LRU) to the engine's capacity in router blocks
(times ``--sized-factor``: a misjudged capacity or tokens-per-character ratio).
Beliefs a placer could combine per request, from indexes it has anyway: ``max(p,approx)`` the
larger of precise and approximate, ``max(p,evicted)`` of precise and approx-evicted,
``max(p,sized)`` of precise and approx-sized, and
``switch`` precise where the events reported an eviction within the last ``--pressure-window``
requests, else ``max(p,approx)``; ``tracker`` the tracker's own belief
(``KvEventTracker.match``: ``max(precise, approx-evicted)`` once the capacity is known, precise
before). Printed per index: requests
whose belief exceeds what the engine holds by more than one router block (``over``: a
misattribution or a stale belief), or falls short of it by more than two (``under``), and the
mean believed against held tokens. Run::

    PYTHONPATH=. python -m bench.prefix_generated [--answers engine|synthetic] [--tracker FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.routing.kv_events import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEventBatch
from runtime.routing.kv_tracker import KvEventTracker
from runtime.routing.prefix import chat_block_hashes
from runtime.routing.prefix_index import PrefixIndex
from runtime.workers.simulator.prefix_cache import (
    PrefixCache,
    PrefixCacheConfig,
    render_chat,
    text_block_hashes,
)

ENDPOINT = 1
BLOCK = 16
ROUTER_BLOCK_TOKENS = 64  # 256 characters at 4 a token


class Events:
    """A :class:`CacheListener` that keeps the events until the tracker is given them."""

    def __init__(self) -> None:
        self.events: list[KvEvent] = []

    def stored(self, parent: int | None, hashes: Sequence[int], block_size: int) -> None:
        self.events.append(BlockStored(tuple(hashes), parent, block_size, len(hashes) * BLOCK))

    def removed(self, hashes: Sequence[int]) -> None:
        self.events.append(BlockRemoved(tuple(hashes)))

    def cleared(self) -> None:
        self.events.append(AllCleared())


@dataclass
class _Turn:
    messages: list[tuple[str, str]]
    rendered: str
    engine: tuple[int, ...]
    answer: str
    conversation: int


@dataclass
class Tally:
    requests: int = 0
    over: int = 0
    under: int = 0
    claimed: int = 0
    held: int = 0

    def add(self, claimed_blocks: int, held_tokens: int) -> None:
        claimed = claimed_blocks * ROUTER_BLOCK_TOKENS
        self.requests += 1
        self.claimed += claimed
        self.held += held_tokens
        self.over += claimed > held_tokens + ROUTER_BLOCK_TOKENS
        self.under += claimed < held_tokens - 2 * ROUTER_BLOCK_TOKENS

    def line(self, name: str) -> str:
        n = max(1, self.requests)
        return (
            f"{name:14} requests {self.requests}  over {self.over} ({self.over / n:.1%})  "
            f"under {self.under} ({self.under / n:.1%})  claimed {self.claimed / n:.0f} "
            f"tokens / held {self.held / n:.0f}"
        )


def _tracker_class(path: Path | None) -> type[KvEventTracker]:
    if path is None:
        return KvEventTracker
    spec = importlib.util.spec_from_file_location("other_kv_tracker", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    cls: type[KvEventTracker] = module.KvEventTracker
    return cls


def _history(
    done: _Turn, args: argparse.Namespace, turns: list[int], systems: list[str]
) -> list[tuple[str, str]]:
    """The conversation's history after the turn ``done``: a new one after ``--turns``."""
    conv = done.conversation
    turns[conv] += 1
    if turns[conv] >= args.turns:
        turns[conv] = 0
        return [("system", systems[conv % args.tenants])]
    said = done.answer if args.answers == "engine" else "x" * len(done.answer)
    return [*done.messages, ("assistant", said)]


APPROXIMATE = ("approximate", "approx+answer", "approx-evicted", "approx-sized")
COMBINED = ("max(p,approx)", "max(p,evicted)", "max(p,sized)", "switch", "tracker")


def _indexes(args: argparse.Namespace) -> dict[str, PrefixIndex]:
    """The :data:`APPROXIMATE` indexes; ``approx-sized`` bounded to the engine's capacity."""
    sized = round(args.sized_factor * args.capacity_blocks * BLOCK / ROUTER_BLOCK_TOKENS)
    return {
        name: PrefixIndex(max_blocks_per_endpoint=max(1, sized))
        if name == "approx-sized"
        else PrefixIndex()
        for name in APPROXIMATE
    }


def _believe(
    tracker: KvEventTracker, indexes: dict[str, PrefixIndex], router: Sequence[int], now: float
) -> dict[str, int]:
    """Router blocks each index believes the engine holds; then the approximate ones learn the
    prompt as sent."""
    believed = {
        "precise": tracker.precise_index.match(router, now, [ENDPOINT]).get(ENDPOINT, 0),
        "tracker": tracker.match(router, now, [ENDPOINT]).get(ENDPOINT, 0),
    }
    for name, index in indexes.items():
        believed[name] = index.match(router, now, [ENDPOINT]).get(ENDPOINT, 0)
        index.record(ENDPOINT, router, now)
    return believed


def _combine(believed: dict[str, int], pressed: bool) -> None:
    """Add the :data:`COMBINED` beliefs to ``believed`` (router blocks per index); ``pressed``:
    the events reported an eviction recently."""
    believed["max(p,approx)"] = max(believed["precise"], believed["approximate"])
    believed["max(p,evicted)"] = max(believed["precise"], believed["approx-evicted"])
    believed["max(p,sized)"] = max(believed["precise"], believed["approx-sized"])
    believed["switch"] = believed["precise" if pressed else "max(p,approx)"]


def replay(args: argparse.Namespace) -> dict[str, Tally]:
    """Per index (``precise`` and :data:`APPROXIMATE`) and per combination (:data:`COMBINED`),
    its beliefs against the engine's hits over the run."""
    rng = random.Random(args.seed)
    events = Events()
    cache = PrefixCache(PrefixCacheConfig(BLOCK, args.capacity_blocks), listener=events)
    indexes = _indexes(args)
    # The tracker applies the engine's removals to its approximate index.
    tracker = _tracker_class(args.tracker)(approximate=indexes["approx-evicted"])
    tracker.set_connected(ENDPOINT, True)
    tallies = {name: Tally() for name in ("precise", *APPROXIMATE, *COMBINED)}
    last_eviction = -args.pressure_window - 1  # the step of the events' last BlockRemoved
    systems = [f"tenant {t}: " + "policy text. " * (80 + 40 * t) for t in range(args.tenants)]
    live = [[("system", systems[c % args.tenants])] for c in range(args.conversations)]
    turns = [0] * args.conversations
    busy: set[int] = set()
    admit: deque[_Turn] = deque()
    leave: deque[_Turn] = deque()

    def flush(now: float) -> None:
        nonlocal last_eviction
        if any(isinstance(event, BlockRemoved) for event in events.events):
            last_eviction = round(now * 100)
        if events.events:
            tracker.apply(ENDPOINT, KvEventBatch(-1, now, tuple(events.events)), now)
            events.events.clear()

    for step in range(args.requests):
        now = step * 0.01
        c = rng.choice([c for c in range(args.conversations) if c not in busy])
        busy.add(c)
        messages = [*live[c], ("user", f"question {step}: " + "details " * rng.randint(10, 120))]
        rendered = render_chat(messages)
        engine = text_block_hashes(rendered, BLOCK)
        router = chat_block_hashes(messages)
        held = cache.hit_tokens(engine, len(rendered) // 4)
        believed = _believe(tracker, indexes, router, now)
        _combine(believed, pressed=step - last_eviction <= args.pressure_window)
        for name, blocks in believed.items():
            tallies[name].add(blocks, held)
        tracker.note_dispatch(ENDPOINT, router, now)
        answer = "".join(rng.choice(" lorem ipsum dolor") for _ in range(rng.randint(200, 600)))
        admit.append(_Turn(messages, rendered, engine, answer, c))
        if len(admit) > 1:  # the previous request enters the engine
            entering = admit.popleft()
            cache.admit(entering.engine, len(entering.rendered) // 4)
            leave.append(entering)
            flush(now)
        if len(leave) > args.running:  # the oldest running one finishes: prompt + answer
            done = leave.popleft()
            cache.store(text_block_hashes(done.rendered + done.answer, BLOCK, known=done.engine))
            flush(now)
            said = chat_block_hashes([*done.messages, ("assistant", done.answer)])
            indexes["approx+answer"].record(ENDPOINT, said, now)
            live[done.conversation] = _history(done, args, turns, systems)
            busy.discard(done.conversation)
    return tallies


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The replay's settings (``main``'s command line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", choices=("engine", "synthetic"), default="engine")
    parser.add_argument("--tracker", type=Path, help="kv_tracker.py to load KvEventTracker from")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--running", type=int, default=4, help="sequences in the engine's batch")
    parser.add_argument("--capacity-blocks", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument(
        "--sized-factor", type=float, default=1.0, help="approx-sized's bound / engine capacity"
    )
    parser.add_argument(
        "--pressure-window", type=int, default=100, help="requests an eviction counts for (switch)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    tallies = replay(args)
    out = sys.stdout
    out.write(f"answers {args.answers}, tracker {args.tracker or 'this checkout'}\n")
    for name, tally in tallies.items():
        out.write(tally.line(name) + "\n")


if __name__ == "__main__":
    main()
