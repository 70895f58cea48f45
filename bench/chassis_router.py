"""``python -m bench.chassis_router STAGES [router args]``: ``python -m runtime.gateway`` with its
inference stage list cut to ``STAGES`` (comma-separated stage names, kept in the router's
order), for the ``switchyard-chassis`` target (issue #27: how much of the router's CPU per
request is its chassis, how much its stages). Nothing of this is in the product: the cut is
made here, around the router's own builder (:func:`runtime.gateway.pipeline.build.
inference_stages`, as :mod:`runtime.gateway.state` calls it), before the router starts.

What stays whatever the list: the consumer (the body read, the context, the request record),
the pipeline's runner and the context's exit stack (the releases that the kept stages
register: ``admit``'s settlement, ``queue``'s grant, ``dispatch``'s upstream close), the end
guard, the relay's sink and the consumer's ``account``; and everything outside the request
path (the snapshot watch, health checks, the usage spool's flush, the metrics).

A name the router's list does not have refuses the start (a renamed stage is not cut
silently).
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

from runtime.gateway.pipeline.stage import Stage


def cut(build: Callable[..., list[Stage]], keep: Sequence[str]) -> Callable[..., list[Stage]]:
    """``build`` returning only the stages named in ``keep`` (in its own order)."""

    def kept(*args: Any, **kwargs: Any) -> list[Stage]:
        stages = build(*args, **kwargs)
        names = [stage.name for stage in stages]
        unknown = sorted(set(keep) - set(names))
        if unknown:
            raise SystemExit(f"chassis_router: no stage {unknown} in the router's {names}")
        chosen = [stage for stage in stages if stage.name in keep]
        print(f"chassis_router: stages {[s.name for s in chosen]}", file=sys.stderr, flush=True)
        return chosen

    return kept


def install(keep: Sequence[str]) -> None:
    """Cut the stage list the router's state builds (before ``runtime.gateway`` runs)."""
    from runtime.gateway import state  # noqa: PLC0415 - the router's own, not at import

    build = getattr(state, "inference_stages")  # noqa: B009 - the name state.py imported
    setattr(state, "inference_stages", cut(build, keep))  # noqa: B010 - replaced, not typed


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit("usage: python -m bench.chassis_router STAGES [router args]")
    keep, args = [n for n in sys.argv[1].split(",") if n], sys.argv[2:]
    sys.argv = ["runtime.gateway", *args]
    install(keep)
    runpy.run_module("runtime.gateway", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
