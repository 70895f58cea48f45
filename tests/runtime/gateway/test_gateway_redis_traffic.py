"""Per-request Redis traffic: none for a channel layer (measured on a private Redis server).

A private ``redis-server`` makes every command attributable to the router under test. The
router talks to Redis for the snapshot (load + pub/sub follow), the batched key-usage flush,
the batched fairness-counter sync, and the tenant limits: at most one ``EVALSHA`` to admit a
request (RPM, TPM and concurrency, atomically; a busy tenant's requests mostly come from a
pre-granted allowance, one grant per chunk: runtime/admission/allowance.py) and at most one to
settle it (one call carries every settlement of a batch). Nothing else is added per request.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from fixtures import redis_server
from fixtures.wait import eventually
from gateway_fleet import (
    CHAT_MODEL,
    Fleet,
    Publisher,
    free_port,
    standard_world,
    start_router,
    wait_ready,
)

pytestmark = pytest.mark.integration

REQUESTS = 60
# Commands only channels_redis issues for a consumer's channel (new_channel/receive/send);
# it also uses ZADD and ZREMRANGEBYSCORE, which the limits scripts use too (see the keys check).
CHANNEL_LAYER_COMMANDS = {"bzpopmin", "zcount", "zpopmin"}
# What the limits scripts run inside their EVALSHA (Redis counts those commands too).
LIMITS_SCRIPT_BODY = {
    "time", "zremrangebyscore", "zcard", "zrange", "hmget", "hset", "pexpire", "zadd", "zrem",
    "exists", "hincrbyfloat",
    # credits (issue #11): escrow, the settled-once marker, the charge, the usage event
    "set", "hget", "hdel", "hincrby", "zrangebyscore", "xadd",
}  # fmt: skip
# What redis-py sends on a new connection: one HELLO, CLIENT SETNAME and SETINFO (Redis 6.2,
# the embedded one, counts the CLIENT SETINFO it refuses; Redis 7.0 does not), and the health
# check's PING (runtime/redis_conn.py: also before a command on a connection idle > 5 s).
CONNECTION_SETUP = {"client", "hello", "ping"}
CLIENT_COMMANDS_PER_CONNECTION = 4
# The Redis clients a router may hold (the async_client calls under runtime/: limits,
# fairness, cache, live telemetry, snapshot, key usage, scaling signals, heartbeat; version
# stats share one). Each connects lazily, on its first call, which may fall in the measured
# window, and its pool opens a second connection when a background call overlaps a
# request's; so the connections opened in the window vary with timing (seen: 1 to 6), but
# never with the number of requests.
ROUTER_CLIENTS = 8
# What the per-version counters' flush sends (runtime/telemetry/versions.py), once a second.
VERSION_STATS_FLUSH = {"hincrby", "expire"}


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[str]:
    with redis_server.private_redis(tmp_path) as server:
        yield server.url


def command_calls(client: redis.Redis[bytes]) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def without_probe(calls: dict[str, int]) -> dict[str, int]:
    """Drop the commands this test itself sends to read the stats."""
    return {k: v for k, v in calls.items() if k not in {"info", "config|resetstat", "config"}}


@pytest.mark.timing
def test_requests_do_not_touch_redis_for_a_channel_layer(
    fleet: Fleet, private_redis: str, tmp_path: Path
) -> None:
    publisher = Publisher(f"switchyard:test:gw-traffic:{uuid.uuid4().hex[:8]}", private_redis)
    world = standard_world(fleet.sims, free_port())
    key = world.secrets.get("good") or world.add_key("good", "acme")
    version = publisher.publish(world.snapshot())
    router = start_router(publisher.prefix, tmp_path, REDIS_URL=private_redis)
    client = redis.Redis.from_url(private_redis)
    try:
        wait_ready(router, version)
        time.sleep(0.5)  # the router's start-up traffic (loads, subscriptions) is not measured
        client.config_resetstat()
        idle_started = time.monotonic()
        time.sleep(2.0)  # the idle window measured (the scenario, not a synchronisation)
        idle = without_probe(command_calls(client))
        idle_s = time.monotonic() - idle_started

        client.config_resetstat()
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=router.base_url, headers=headers, timeout=30) as http:
            for index in range(REQUESTS):
                body = {
                    "model": CHAT_MODEL,
                    "messages": [{"role": "user", "content": f"hi {index}"}],
                    "max_tokens": 2,
                    "stream": index % 2 == 0,
                }
                assert http.post("/v1/chat/completions", json=body).status_code == 200
        # The last settlements wait out their batch's linger (runtime/admission/redis_limits.py);
        # a batch is one settle call, each settlement's usage event one XADD inside it
        eventually(
            lambda: without_probe(command_calls(client)).get("xadd", 0) >= REQUESTS,
            timeout=5, interval=0.05, what="the last settlement batch",
        )  # fmt: skip
        busy_s = time.monotonic() - started
        busy = without_probe(command_calls(client))
        total = sum(busy.values())
        print(  # the measurement is the point of this test
            f"\nRedis commands from the router: idle {idle} over {idle_s:.1f} s; "
            f"{REQUESTS} requests over {busy_s:.1f} s: {busy} (total {total})"
        )
        assert not CHANNEL_LAYER_COMMANDS & set(busy)
        assert not [k for k in client.keys("*") if k.startswith(b"asgi")]
        # The limits: at most one EVALSHA to admit (allowance grants included) and one to
        # settle, per request (plus the first call of each script: NOSCRIPT, then loaded); a
        # settle call carries every settlement of its batch, each one SET NX (its done mark).
        assert busy.get("evalsha", 0) <= 2 * REQUESTS + 4, busy
        assert busy.get("set", 0) >= REQUESTS, busy
        # Besides: the snapshot follower's keep-alives, one key-usage flush per 5 s, the
        # fairness counters' push (once a second while no queue is contended) and the
        # connection set-up of the limits and fairness clients.
        connections = busy.get("hello", 0)  # one per connection opened in the window
        assert connections <= 2 * ROUTER_CLIENTS < REQUESTS, busy  # pooled, not per request
        assert busy.get("client", 0) <= CLIENT_COMMANDS_PER_CONNECTION * connections, busy
        # a PING per connection opened, and per pooled connection idle > 5 s before its use
        assert busy.get("ping", 0) <= connections + 2 * ROUTER_CLIENTS * (1 + busy_s / 5), busy
        others = sum(
            v
            for k, v in busy.items()
            if k != "evalsha"
            and k not in LIMITS_SCRIPT_BODY
            and k.split("|")[0] not in CONNECTION_SETUP
            and k not in VERSION_STATS_FLUSH
        )
        assert others <= 12 + 4 * (busy_s / 5.0) + 2 * busy_s, busy
        # The per-version counters (rollout gates): one pipelined batch a second, one EXPIRE
        # per 2 s bucket touched and one HINCRBY per counter in it; not per request.
        flushes = busy_s / 1.0 + 2
        assert busy.get("expire", 0) <= 2 * flushes, busy
        assert busy.get("hincrby", 0) <= 25 * busy.get("expire", 0), busy

        # The batched key-usage flush lands within its 5 s period (off the request path).
        prefix = key.split("_")[1]
        last_used = eventually(
            lambda: client.hget(f"{publisher.prefix}:apikey:last_used", prefix),
            timeout=8, interval=0.2, what="the key-usage flush",
        )  # fmt: skip
        assert abs(float(last_used) - time.time()) < 30
    finally:
        client.close()
        router.stop()
        publisher.cleanup()
