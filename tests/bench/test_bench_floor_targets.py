"""Issue #27's floor targets start and answer: ``transport-proxy`` (the router's transport
alone) and ``switchyard-chassis`` (the router with its fewest stages) each relay one streamed
chat completion with the bytes the backend gives directly (ids and ``created`` aside), as
``python -m bench.tls_micro`` checks before its rounds. Real simulator, real router, the
suite's Redis."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import aiohttp
import pytest

from bench.backends import start_backends
from bench.runner import DEFAULT_REDIS_URL, new_key
from bench.scenario import load
from bench.targets import CHASSIS, FACTORIES, TargetContext
from bench.tls_micro import SCENARIO, comparable, same_bytes

pytestmark = pytest.mark.integration

NEW_TARGETS = ("transport-proxy", "switchyard-chassis")


def test_the_comparison_blanks_ids_and_times_but_not_the_text() -> None:
    first = b'data: {"id":"chatcmpl-1","created":17,"choices":[{"delta":{"content":"a"}}]}\n\n'
    other_id = first.replace(b"chatcmpl-1", b"chatcmpl-2").replace(b"17", b"18")
    assert comparable(first) == comparable(other_id)
    assert comparable(first) != comparable(first.replace(b'"a"', b'"b"'))


@pytest.mark.asyncio
async def test_the_floor_targets_answer_a_stream_with_the_backends_bytes() -> None:
    scenario = load(SCENARIO, {"backends.count": 1})
    keys = {t.name: new_key() for t in scenario.tenants}
    key = next(iter(keys.values()))
    with tempfile.TemporaryDirectory(prefix="floor-targets-") as work:
        logs = Path(work)
        async with aiohttp.ClientSession() as session:
            backends = await start_backends(scenario.backends, session=session, log_dir=logs,
                                            cpus=(), timeout_s=30.0)  # fmt: skip
            ctx = TargetContext(
                scenario=scenario, backend_urls=[b.base_url for b in backends], work_dir=logs,
                redis_url=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
                run_id=uuid.uuid4().hex[:8], router_cpus=(), session=session, keys=keys,
                start_timeout_s=30.0,
            )  # fmt: skip
            direct = [b.base_url for b in backends]
            try:
                for name in NEW_TARGETS:
                    target = FACTORIES[name]()
                    try:
                        await target.start(ctx)
                        url = target.base_urls[0]
                        assert await same_bytes(session, url, direct, key=key,
                                                model=scenario.backends.model), name  # fmt: skip
                        if name == "switchyard-chassis":  # the cut was made, and said so
                            log = (logs / f"{name}.log").read_text()
                            assert f"chassis_router: stages {list(CHASSIS)}" in log
                    finally:
                        await target.stop()
            finally:
                for child in backends:
                    child.stop()
