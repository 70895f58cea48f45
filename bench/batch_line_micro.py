"""CPU per request of the ``batch_line`` stage (the Batch API executor's line mark).

``python -m bench.batch_line_micro [--iterations 20000]`` runs the real stage object
(:class:`~runtime.gateway.pipeline.stages.batch_line.BatchLineMark`) on a request context as
the pipeline builds it (snapshot, principal), timed with ``time.process_time``:

- ``unmarked``: an online request (no ``X-Switchyard-Batch-Line``): the header lookup, then
  nothing: what every request pays;
- ``marked``: a batch line whose mark verifies (parse, HMAC-SHA256 check, the tenant and the
  age of the signature): what each batch line pays;
- ``forged``: a mark that does not verify (the 401 ``invalid_batch_line`` error built).

The stage's effects further on (the batch lane in ``admit``, the event id in ``settle``)
replace the online equivalents and cost the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import cast

from bench.stage_context import cpu_us_per_call
from runtime.admission.redis_limits import RedisLimits
from runtime.gateway.auth import Principal
from runtime.gateway.bundles import AdmissionDeps, PriceHolder
from runtime.gateway.errors import ApiError
from runtime.gateway.inference import ChatCompletionsConsumer
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.batch_line import BatchLineMark
from runtime.internal_principal import sign_line
from runtime.routing.table import RoutingTable
from runtime.scheduling.pools import Dispatchers
from runtime.snapshot import Snapshot
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.metrics import RouterMetrics
from runtime.testing.fleet import HandFleet
from runtime.testing.snapshots import SnapshotBuilder

SECRET = "bench-internal-secret"  # noqa: S105 - a bench's own, signs nothing real
BODY = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}'


class _Sink:
    async def start_response(self, status: int, headers: object) -> None:
        return None

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        return None


def _stage() -> BatchLineMark:
    deps = AdmissionDeps(
        limits=cast(RedisLimits, None),  # the stage never reads the tenant limits
        dispatchers=Dispatchers(placement_for=lambda pool: HandFleet(), tick_s=0.05),
        table=RoutingTable(), prices=PriceHolder(), metrics=RouterMetrics(), default_band=1,
        internal_secret=SECRET,
    )  # fmt: skip
    return BatchLineMark(deps)


def _snapshot() -> Snapshot:
    world = SnapshotBuilder()
    world.add_tenant("acme")
    world.add_key("k", "acme")
    return world.snapshot()


def _context(snapshot: Snapshot, mark: bytes | None) -> RequestContext:
    spec = ChatCompletionsConsumer.spec

    def headers(name: bytes) -> bytes | None:
        return mark if name == b"x-switchyard-batch-line" else None

    ctx = RequestContext(spec=spec, request_id="r", body=BODY, headers=headers, raw_headers=(),
                         client=_Sink(), cut=lambda: None,
                         record=RequestRecord(request_id="r", route=spec.route))  # fmt: skip
    ctx.snapshot = snapshot
    key = next(iter(snapshot.api_keys.values()))
    ctx.principal = Principal(key, snapshot.tenants[key.tenant])
    return ctx


def _stage_us(stage: BatchLineMark, snapshot: Snapshot, mark: bytes | None, n: int) -> float:
    """CPU microseconds per call (a fresh context each time, built untimed)."""
    contexts = [_context(snapshot, mark) for _ in range(n)]

    async def call(ctx: RequestContext) -> None:
        with contextlib.suppress(ApiError):  # the forged case: the refusal is the work
            await stage(ctx)

    return cpu_us_per_call(call, contexts, warm=_context(snapshot, mark))


def measure(iterations: int) -> dict[str, float]:
    stage, snapshot = _stage(), _snapshot()
    mark = sign_line(SECRET, tenant="acme", ref="123456", now=time.time()).encode()
    forged = sign_line("another-secret", tenant="acme", ref="123456", now=time.time()).encode()
    checked = _context(snapshot, mark)
    asyncio.run(stage(checked))
    if checked.batch_line != "123456":
        raise AssertionError("the bench's mark did not verify")
    return {
        "unmarked_us": _stage_us(stage, snapshot, None, iterations),
        "marked_us": _stage_us(stage, snapshot, mark, iterations),
        "forged_us": _stage_us(stage, snapshot, forged, iterations),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args(argv)
    m = measure(args.iterations)
    print("batch_line stage (CPU per request)")
    print(f"online request, no mark:      {m['unmarked_us']:8.2f} us")
    print(f"batch line, mark verified:    {m['marked_us']:8.2f} us")
    print(f"forged mark, 401 built:       {m['forged_us']:8.2f} us")


if __name__ == "__main__":
    main()
