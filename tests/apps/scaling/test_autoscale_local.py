"""The controller end to end on simulator replicas: signals through Redis, decisions recorded,
the local actuator starting, promoting, draining and stopping real processes."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from fixtures.control_plane import endpoint_ready, version_published
from fixtures.wait import eventually

from apps.models.models import Endpoint, Pool
from apps.models.services import (
    endpoint_register,
    endpoint_set_state,
    model_create,
    pool_create,
    pool_update,
)
from apps.scaling.actuators.local import LocalActuator, Record
from apps.scaling.models import ReplicaStart, ScalingDecision
from apps.scaling.selectors import expected_start_s
from apps.scaling.services import autoscale_all, pool_scaling_get_or_create, pool_scaling_update
from runtime.artifacts import manifest_digest
from runtime.contract import scaling_leader_key, scaling_signals_key
from runtime.procs import pid_alive
from runtime.scaling.signals import PoolSignals, encode

pytestmark = [pytest.mark.integration, pytest.mark.django_db]
MODEL = "scale-chat"


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(settings.REDIS_URL)
    yield c
    c.close()


@pytest.fixture
def namespace(client: redis.Redis) -> Iterator[str]:
    ns = f"switchyard:test:scaling:{uuid.uuid4().hex[:8]}"
    yield ns
    for key in client.scan_iter(f"{ns}:*"):
        client.delete(key)


@pytest.fixture
def pool(db: Any) -> Pool:
    model = model_create(actor=None, name=MODEL, task="chat")
    files = {"model.safetensors": "cd" * 32}
    manifest = {"files": files, "max_context": 2048, "tokenizer": "t", "default_sampling": {}}
    version = version_published(
        model, "v1", artifact_uri="file:///m", runtime="simulator", digest=manifest_digest(files),
        manifest=manifest,
    )  # fmt: skip
    pool = pool_create(
        actor=None, name="sim-pool", hardware_tier="cpu", cost_per_replica_hour="0", min_replicas=0,
        max_replicas=3,
        warm_replicas=1, policies={},
    )  # fmt: skip
    # The pool ran this version before (the actuator starts what the pool last served).
    endpoint_ready(pool, version, "http://127.0.0.1:9", capacity=8, state=Endpoint.State.GONE)
    scaling = pool_scaling_get_or_create(pool=pool)
    pool_scaling_update(
        actor=None, scaling=scaling, out_cooldown_s=0, in_cooldown_s=0, idle_to_zero_s=0
    )
    return pool


@pytest.fixture
def actuator(pool: Pool, namespace: str, tmp_path: Path) -> Iterator[LocalActuator]:
    act = LocalActuator(
        redis_url=settings.REDIS_URL, namespace=namespace, log_dir=tmp_path, capacity=8,
        engine_args=("--decode-a-ms", "10"), start_timeout_s=30, drain_timeout_s=20,
    )  # fmt: skip
    yield act
    act.stop_all(pool)


def publish(client: redis.Redis, namespace: str, **values: Any) -> None:
    import time  # noqa: PLC0415

    signals = PoolSignals(pool="sim-pool", at=time.time(), **values)
    client.hset(scaling_signals_key(namespace, "sim-pool"), "router-a", encode(signals))


def stream(base_url: str, max_tokens: int) -> int:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": max_tokens,
                       "ignore_eos": True}).encode()  # fmt: skip
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        out = json.loads(resp.read())
    return int(out["usage"]["completion_tokens"])


def ready(pool: Pool) -> list[Endpoint]:
    return list(Endpoint.objects.filter(pool=pool, state=Endpoint.State.READY).order_by("id"))


def test_from_zero_out_with_warm_promotion_drained_in_and_back_to_zero(
    pool: Pool, actuator: LocalActuator, client: redis.Redis, namespace: str
) -> None:
    def tick() -> ScalingDecision:
        decisions = autoscale_all(client=client, actuator=actuator, namespace=namespace)
        assert decisions is not None
        assert len(decisions) == 1
        return decisions[0]

    # 1. Demand on an empty pool: one replica starts cold, and one warm replica behind it.
    publish(client, namespace, queued={"1": 2})
    first = tick()
    assert (first.action, first.current, first.desired, first.started) == ("out", 0, 1, 1)
    assert first.signals["queued"] == {"1": 2}
    assert "scale from zero" in first.reason
    assert len(ready(pool)) == 1
    assert actuator.observe(pool).warm == 1

    # 2. Saturated: the warm replica is promoted (no start), a new warm one refills.
    publish(client, namespace, inflight=8, capacity=8, ready=1, dispatched_per_s=5)
    second = tick()
    assert (second.action, second.desired, second.promoted, second.started) == ("out", 2, 1, 0)
    assert len(ready(pool)) == 2
    warm = ReplicaStart.objects.get(warm=True)
    cold = ReplicaStart.objects.get(warm=False)
    assert warm.seconds < cold.seconds / 5, (warm.seconds, cold.seconds)
    assert expected_start_s(version_id=cold.version_id) == cold.seconds

    # 3. Load falls: scale in drains one replica while it still serves a request.
    a, b = ready(pool)
    results: dict[str, int] = {}

    def serve(endpoint: Endpoint, tokens: int) -> None:
        results[endpoint.base_url] = stream(endpoint.base_url, tokens)

    threads = [threading.Thread(target=serve, args=(e, n)) for e, n in ((a, 60), (b, 120))]
    for t in threads:
        t.start()
    from apps.scaling.actuators.local import engine_load  # noqa: PLC0415

    eventually(lambda: engine_load(a.base_url) + engine_load(b.base_url) == 2, timeout=10,
               what="both replicas serving one request")  # fmt: skip
    publish(client, namespace, inflight=1, capacity=16, ready=2, dispatched_per_s=1)
    third = tick()
    for t in threads:
        t.join(timeout=30)
    assert (third.action, third.current, third.desired, third.stopped) == ("in", 2, 1, 1)
    assert results == {a.base_url: 60, b.base_url: 120}  # the drained one finished its request
    assert len(ready(pool)) == 1

    # 4. Idle (idle_to_zero_s=0): to zero, every process stopped, every endpoint gone.
    pids = [record.pid for record in actuator.records(pool).values()]
    assert len(pids) == 2  # the serving one and the warm one
    publish(client, namespace)
    fourth = tick()
    assert (fourth.action, fourth.desired) == ("zero", 0)
    assert not Endpoint.objects.filter(pool=pool).exclude(state=Endpoint.State.GONE).exists()
    assert not any(pid_alive(p) for p in pids)
    assert actuator.records(pool) == {}
    assert ScalingDecision.objects.filter(pool=pool).count() == 4


def test_one_leader_at_a_time(
    pool: Pool, actuator: LocalActuator, client: redis.Redis, namespace: str
) -> None:
    client.set(scaling_leader_key(namespace), "someone-else", ex=30)
    assert autoscale_all(client=client, actuator=actuator, namespace=namespace) is None
    assert not ScalingDecision.objects.exists()
    client.delete(scaling_leader_key(namespace))
    decisions = autoscale_all(client=client, actuator=actuator, namespace=namespace)
    assert decisions is not None
    assert decisions[0].action == "hold"
    assert decisions[0].reason == "no replica serves and no demand"


def test_a_replica_that_cannot_start_is_recorded_as_an_error(
    pool: Pool, client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    broken = LocalActuator(
        redis_url=settings.REDIS_URL, namespace=namespace, log_dir=tmp_path,
        engine_args=("--max-model-len", "-1"), start_timeout_s=10,
    )  # fmt: skip
    publish(client, namespace, queued={"1": 1})
    decisions = autoscale_all(client=client, actuator=broken, namespace=namespace)
    assert decisions is not None
    assert decisions[0].action == "out"
    assert "did not start" in decisions[0].error
    assert pool_scaling_get_or_create(pool=pool).last_out_at is None  # retried next tick


def test_a_replica_it_did_not_start_is_never_stopped(
    pool: Pool, actuator: LocalActuator, client: redis.Redis, namespace: str
) -> None:
    seed = Endpoint.objects.get(pool=pool)
    foreign = endpoint_register(
        actor=None, pool=pool, version=seed.version, base_url="http://127.0.0.1:10", capacity=8
    )
    endpoint_set_state(actor=None, endpoint=foreign, state=Endpoint.State.READY)
    publish(client, namespace)  # idle, idle_to_zero_s = 0
    decisions = autoscale_all(client=client, actuator=actuator, namespace=namespace)
    assert decisions is not None
    assert (decisions[0].action, decisions[0].stopped) == ("zero", 0)
    foreign.refresh_from_db()
    assert foreign.state == Endpoint.State.READY


def test_a_replica_that_dies_is_taken_out_and_replaced(
    pool: Pool, actuator: LocalActuator, client: redis.Redis, namespace: str
) -> None:
    pool_update(actor=None, pool=pool, min_replicas=1)  # warm_replicas stays 1
    publish(client, namespace)
    first = autoscale_all(client=client, actuator=actuator, namespace=namespace)
    assert first is not None
    assert (first[0].action, first[0].started) == ("out", 1)  # up to min, one warm behind it
    ((dead_id, record),) = [(i, r) for i, r in actuator.records(pool).items() if not r.warm]
    os.kill(record.pid, signal.SIGKILL)
    eventually(lambda: not pid_alive(record.pid), timeout=10, what="the replica gone")
    publish(client, namespace)
    again = autoscale_all(client=client, actuator=actuator, namespace=namespace)
    assert again is not None
    decision = again[0]
    assert (decision.action, decision.current, decision.promoted) == ("out", 0, 1), decision.reason
    assert Endpoint.objects.get(pk=dead_id).state == Endpoint.State.GONE
    records = actuator.records(pool)
    assert dead_id not in records
    assert len(records) == 2  # the promoted one, and a new warm one
    assert all(r.alive for r in records.values())
    assert [e.pk for e in ready(pool)] == [i for i, r in records.items() if not r.warm]


def test_a_reused_pid_is_not_taken_for_the_replica() -> None:
    assert Record(os.getpid(), 1, warm=False).alive is False  # our pid, without "--port 1"
    assert Record.decode(Record(7, 8, warm=True).encode()) == Record(7, 8, warm=True)


def test_the_out_cooldown_counts_from_when_the_replica_serves(
    pool: Pool, actuator: LocalActuator, client: redis.Redis, namespace: str
) -> None:
    """A start that takes long (vLLM: a minute or more) gets its whole cooldown afterwards."""
    times = iter([100.0, 160.0])  # decided at 100, the replica served at 160
    publish(client, namespace, queued={"1": 1})
    decisions = autoscale_all(
        client=client, actuator=actuator, namespace=namespace, clock=lambda: next(times)
    )
    assert decisions is not None
    assert decisions[0].action == "out"
    assert pool_scaling_get_or_create(pool=pool).last_out_at == 160.0


def test_a_replica_restarting_its_engine_still_counts_and_gets_no_twin(
    pool: Pool, actuator: LocalActuator, client: redis.Redis, namespace: str
) -> None:
    """A worker whose engine died takes its endpoint out of routing (``draining``) while it
    restarts the engine; its process lives, so the pool still has that replica (the chaos suite
    saw a second cold vLLM start beside the restarting one)."""
    pool_update(actor=None, pool=pool, min_replicas=1, warm_replicas=0)
    publish(client, namespace)
    first = autoscale_all(client=client, actuator=actuator, namespace=namespace)
    assert first is not None
    assert (first[0].action, first[0].started) == ("out", 1), first[0].reason
    ((endpoint,),) = [ready(pool)]
    endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.DRAINING)
    assert actuator.observe(pool).serving == 1
    publish(client, namespace)
    again = autoscale_all(client=client, actuator=actuator, namespace=namespace)
    assert again is not None
    assert again[0].started == 0, again[0].reason
    assert list(actuator.records(pool)) == [endpoint.pk]
