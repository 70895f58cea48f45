"""The router's per-version counters: what one request adds, and a failed flush keeps them."""

from __future__ import annotations

import pytest
from fixtures.net import free_port

from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.versions import BUCKET_S, VersionStats, stats_key, ttft_bucket

pytestmark = pytest.mark.integration

pytestmark = [pytest.mark.asyncio]


@pytest.mark.unit
async def test_a_request_without_a_version_is_not_counted() -> None:
    stats = VersionStats("redis://127.0.0.1:1/0", namespace="ns", clock=lambda: 100.0)
    stats.record_request(RequestRecord(request_id="r", route="chat", status=401))
    assert stats.pending == 0
    record = RequestRecord(request_id="r", route="chat", model="m", version="v2", status=503,
                           outcome="no_capacity")  # fmt: skip
    stats.record_request(record)
    assert stats.pending == 1
    assert stats_key("ns", "m", "v2", 100 // BUCKET_S) == "ns:vstats:m|v2:50"
    assert ttft_bucket(0.0) == 0
    assert ttft_bucket(1e9) == 18  # the open last bucket


@pytest.mark.integration
async def test_a_failed_flush_keeps_the_counts_for_the_next_one() -> None:
    stats = VersionStats(f"redis://127.0.0.1:{free_port()}/0", namespace="ns", interval_s=60)
    await stats.start()
    try:
        stats.record(model="m", version="v1", status=200, outcome="ok", ttft_ms=12.0,
                     prompt_tokens=3, completion_tokens=4)  # fmt: skip
        assert await stats.flush() == 0
        assert stats.pending == 1
    finally:
        await stats.stop()  # its last flush fails too, and stop still returns
