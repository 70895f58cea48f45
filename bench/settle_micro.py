"""CPU per request of settling (issue #27): the ``settle`` stage's usage event and
:func:`~runtime.gateway.admit.settle_limits` into a :class:`RedisLimits` (not started: the
settlement is spooled to a real file and queued, as on the request path; the batched Redis
write is the background task's). Best and median of ``--rounds`` rounds, microseconds per
settle, ``time.process_time``.

``python -m bench.settle_micro [--iterations 20000] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from runtime.admission.limits import Lease, Quota
from runtime.admission.redis_limits import RedisLimits
from runtime.gateway.admit import Admission
from runtime.gateway.pipeline.stages.settle import settle
from runtime.gateway.relay import Usage
from runtime.metering.pricing import Rate
from runtime.telemetry.logging import RequestRecord


def _context(admission: Admission) -> Any:
    """What the settle stage reads of a finished streamed request's context."""
    record = RequestRecord(request_id="r-1", route="/v1/chat/completions", api_key="sk-abc",
                           endpoint="1", outcome="ok",
                           timings_ms={"queue": 0.4, "upstream_ttft": 12.0})  # fmt: skip
    plan = SimpleNamespace(prompt_tokens=60, version=SimpleNamespace(id=1),
                           klass=SimpleNamespace(name="interactive"), streaming=True)  # fmt: skip
    return SimpleNamespace(
        ready_admission=admission, ready_plan=plan, record=record, hit=None, batch_line="",
        attempts=SimpleNamespace(opened=True, grant=SimpleNamespace(charged_output=8)),
        usage=Usage(prompt_tokens=60, completion_tokens=8, total_tokens=68),
    )  # fmt: skip


def measure(iterations: int, rounds: int) -> list[float]:
    spool = Path(tempfile.mkdtemp(prefix="switchyard-settle-micro-"))
    limits = RedisLimits("redis://127.0.0.1:1/0", spool_dir=spool)
    limits._spool.open()  # type: ignore[union-attr]  # what start() does, without Redis
    quota = Quota(rpm=600, tpm=200_000, concurrency=16)
    rate = Rate(input_uc=1.0, output_uc=2.0)
    figures: list[float] = []
    for _ in range(rounds):
        contexts = []
        for i in range(iterations):
            lease = Lease(id=f"l{i}", tenant="acme", quota=quota, tokens=100, source="redis")
            contexts.append(_context(Admission(lease=lease, rate=rate, tier="standard")))
        deps: Any = SimpleNamespace(limits=limits)
        start = time.process_time()
        for ctx in contexts:
            settle(deps, ctx)
        figures.append((time.process_time() - start) / iterations * 1e6)
        limits._settles.clear()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.settle_micro", description=__doc__)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures = measure(args.iterations, args.rounds)
    print(f"settle (usage event + limits settlement, spooled), CPU us per request: best "
          f"{min(figures):.2f}, median {statistics.median(figures):.2f} "
          f"(rounds: {' / '.join(f'{f:.2f}' for f in figures)})")


if __name__ == "__main__":
    main()
