"""The router's per-version counters: what one request adds, and a failed flush keeps them."""

from __future__ import annotations

from typing import Any, cast

import pytest
from fixtures.net import free_port
from redis.exceptions import RedisError

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


@pytest.mark.unit
def test_the_fields_a_flush_writes() -> None:
    now = [100.0]
    stats = VersionStats("redis://127.0.0.1:1/0", namespace="ns", clock=lambda: now[0])
    stats.record(model="m", version="v1", status=200, outcome="ok", ttft_ms=12.0,
                 prompt_tokens=3, completion_tokens=4, itl_ms=[1.5, 1.6, 50.0])  # fmt: skip
    stats.record(model="m", version="v1", status=502, outcome="upstream_error", ttft_ms=None,
                 prompt_tokens=None, completion_tokens=0, e2e_ms=30.0)  # fmt: skip
    stats.record(model="m", version="v1", status=0, outcome="", ttft_ms=None,
                 prompt_tokens=2, completion_tokens=None)  # fmt: skip
    now[0] = 102.0  # the next bucket
    stats.record(model="m", version="v2", status=200, outcome="ok", ttft_ms=1e9,
                 prompt_tokens=1, completion_tokens=1)  # fmt: skip
    assert stats.pending == 2
    assert stats.pending_fields() == {
        "ns:vstats:m|v1:50": {
            "n": 3, "err": 2, "err:upstream_error": 1, "err:error": 1, "pt": 5, "ct": 4,
            "ttft:2": 1, "itl:1": 2, "itl:10": 1, "e2e:2": 1,
        },
        "ns:vstats:m|v2:51": {"n": 1, "pt": 1, "ct": 1, "ttft:18": 1},
    }  # fmt: skip


class _FailingPipe:
    def hincrby(self, key: str, name: str, value: int) -> None:
        pass

    def expire(self, key: str, seconds: int) -> None:
        pass

    async def execute(self) -> list[object]:
        raise RedisError("down")

    async def __aenter__(self) -> _FailingPipe:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


class _FailingRedis:
    def pipeline(self, *, transaction: bool) -> _FailingPipe:
        return _FailingPipe()


@pytest.mark.unit
async def test_a_failed_flush_adds_its_counts_to_the_next_ones() -> None:
    stats = VersionStats("redis://127.0.0.1:1/0", namespace="ns", clock=lambda: 100.0)
    stats._client = cast(Any, _FailingRedis())  # Redis that fails every write
    stats.record(model="m", version="v1", status=200, outcome="ok", ttft_ms=None,
                 prompt_tokens=3, completion_tokens=None)  # fmt: skip
    assert await stats.flush() == 0
    stats.record(model="m", version="v1", status=500, outcome="internal_error", ttft_ms=None,
                 prompt_tokens=2, completion_tokens=None)  # fmt: skip
    assert stats.pending == 1
    assert stats.pending_fields() == {
        "ns:vstats:m|v1:50": {"n": 2, "err": 1, "err:internal_error": 1, "pt": 5}
    }
    assert await stats.flush() == 0
    assert stats.pending_fields()["ns:vstats:m|v1:50"]["n"] == 2
