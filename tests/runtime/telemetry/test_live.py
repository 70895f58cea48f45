"""The live aggregator: per-second rows from request records, published to real Redis."""

from __future__ import annotations

import asyncio
import json
import uuid

import msgspec
import pytest
import redis
from fixtures.router import redis_url
from fixtures.wait import async_eventually

from runtime.telemetry.live import (
    MAX_SAMPLES,
    LiveAggregator,
    LiveSources,
    live_backlog,
    live_channel,
    percentiles,
)
from runtime.telemetry.logging import RequestRecord

pytestmark = pytest.mark.integration


def _record(
    tenant: str,
    *,
    status: int = 200,
    outcome: str = "ok",
    e2e: float = 100.0,
    ttft: float | None = 40.0,
    endpoint: str = "7",
    stream: bool = True,
) -> RequestRecord:
    record = RequestRecord(
        request_id="r",
        route="/v1/chat/completions",
        tenant=tenant,
        model="m",
        version="v1",
        klass="interactive",
        endpoint=endpoint,
        status=status,
        outcome=outcome,
        prompt_tokens=3,
        completion_tokens=5,
        stream=stream,
    )
    record.timings_ms = {"e2e": e2e, "queue": 10.0, "upstream_ttft": 25.0}
    if ttft is not None:
        record.timings_ms["ttft"] = ttft
    return record


def test_rows_per_key_with_outcomes_stages_and_tokens() -> None:
    live = LiveAggregator(
        "redis://unused", "ns", LiveSources(pool_of=lambda e: f"pool-{e}"), clock=lambda: 100.0
    )
    live.record(_record("acme"))
    live.record(_record("acme", e2e=300.0, ttft=60.0))
    live.record(_record("acme", status=429, outcome="shed", ttft=None, endpoint=""))
    live.record(_record("other", ttft=900.0, stream=False))  # unary: no TTFT sample (#33)
    live.record(_record("other"))
    document = live.close_bucket()
    rows = {(r["tenant"], r["pool"]): r for r in document["rows"]}
    assert set(rows) == {("acme", "pool-7"), ("acme", ""), ("other", "pool-7")}
    served = rows[("acme", "pool-7")]
    assert served["requests"] == 2
    assert served["errors"] == 0
    assert served["ttft_ms"] == {"p50": 40.0, "p95": 60.0, "p99": 60.0}
    assert served["e2e_ms"]["p50"] == 100.0
    # gateway = ttft - queue - upstream; stream = e2e - ttft (means over the second)
    assert served["stages_ms"] == {
        "gateway": 15.0,
        "queue": 10.0,
        "upstream_ttft": 25.0,
        "stream": 150.0,
    }
    assert served["tokens_in"] == 6
    assert served["tokens_out"] == 10
    refused = rows[("acme", "")]
    assert (refused["throttled"], refused["shed"], refused["errors"]) == (1, 1, 1)
    assert refused["ttft_ms"] is None
    assert rows[("other", "pool-7")]["ttft_ms"] == {"p50": 40.0, "p95": 40.0, "p99": 40.0}
    assert refused["stages_ms"]["queue"] is None
    assert document["ts"] == 100.0
    assert document["v"] == 1
    assert live.close_bucket()["rows"] == []  # a new second starts empty


def test_itl_percentiles_from_timing_or_stream_and_router_routes() -> None:
    routes = {"m": {"v1": 95, "v2": 5}}
    live = LiveAggregator(
        "redis://unused",
        "ns",
        LiveSources(routes=lambda: routes, snapshot_version=lambda: 42),
        clock=lambda: 1.0,
    )
    streamed = _record("acme", e2e=140.0, ttft=40.0)
    streamed.stream = True
    live.record(streamed)  # 5 tokens: (140 - 40) / 4 = 25 ms
    measured = _record("acme", e2e=140.0, ttft=40.0)
    measured.timings_ms["itl"] = 7.5  # the gateway's own measure wins
    live.record(measured)
    one_token = _record("globex", e2e=140.0, ttft=40.0)
    one_token.stream = True
    one_token.completion_tokens = 1  # no gap after a single token
    live.record(one_token)
    live.record(_record("globex", e2e=140.0, ttft=40.0, stream=False))  # unary: one body
    document = live.close_bucket()
    rows = {r["tenant"]: r for r in document["rows"]}
    assert rows["acme"]["itl_ms"] == {"p50": 7.5, "p95": 25.0, "p99": 25.0}
    assert rows["globex"]["itl_ms"] is None
    assert document["routes"] == routes
    assert document["snapshot_version"] == 42


def test_samples_are_capped_per_row() -> None:
    live = LiveAggregator("redis://unused", "ns")
    for i in range(MAX_SAMPLES * 3):
        live.record(_record("acme", e2e=float(i)))
    (row,) = live.close_bucket()["rows"]
    assert row["requests"] == MAX_SAMPLES * 3
    assert row["e2e_ms"]["p99"] >= MAX_SAMPLES * 2  # recent samples displaced old ones


def test_percentiles_nearest_rank() -> None:
    assert percentiles([]) is None
    assert percentiles([5.0]) == {"p50": 5.0, "p95": 5.0, "p99": 5.0}
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == {"p50": 50.0, "p95": 95.0, "p99": 99.0}


def test_publishes_each_second_to_channel_and_capped_backlog() -> None:
    namespace = f"switchyard:test:live:{uuid.uuid4().hex[:10]}"
    sync = redis.Redis.from_url(redis_url())
    pubsub = sync.pubsub()
    pubsub.subscribe(live_channel(namespace))
    pubsub.get_message(timeout=1.0)  # the subscribe confirmation

    async def scenario() -> None:
        live = LiveAggregator(redis_url(), namespace, interval_s=0.05, backlog=3)
        await live.start()
        try:
            live.record(_record("acme"))
            await async_eventually(
                lambda: sync.llen(live_backlog(namespace)) == 3,
                timeout=5.0,
                what="three documents in the backlog",
            )
        finally:
            await live.stop()

    try:
        asyncio.run(scenario())
        message = pubsub.get_message(timeout=2.0)
        assert message is not None
        assert message["type"] == "message"
        first = json.loads(message["data"])
        assert [r["tenant"] for r in first["rows"]] == ["acme"]
        assert sync.llen(live_backlog(namespace)) == 3  # trimmed to the cap
        newest = msgspec.json.decode(sync.lindex(live_backlog(namespace), 0))
        assert newest["rows"] == []
    finally:
        pubsub.close()
        sync.delete(live_backlog(namespace))
        sync.close()


def test_publish_without_redis_drops_the_second() -> None:
    async def scenario() -> bool:
        live = LiveAggregator("redis://127.0.0.1:1/0", "ns")
        await live.start()
        try:
            live.record(_record("acme"))
            return await live.publish_once()
        finally:
            await live.stop()

    assert asyncio.run(scenario()) is False
