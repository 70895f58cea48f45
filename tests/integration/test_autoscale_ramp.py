"""A load ramp through a real router, driven by the autoscaler end to end.

The control plane's records (PostgreSQL) publish the snapshot to Redis; a real router process
routes to simulator replicas and publishes its per-pool signals; the controller
(``apps.scaling.services.autoscale_all`` with the local actuator, called every 0.5 s in a bounded
loop in a thread — the Celery task is a thin wrapper around the same call, and a real Celery
beat at 5 s would only slow the test) reads them, records its decisions and starts / drains real
simulator processes. Load goes up: the pool scales out within a bounded time; load goes down:
it scales back in after the in cooldown; no request fails on the way.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from django.db import connection
from fixtures.router import Process, Publisher, start_router, wait_ready
from fixtures.wait import eventually

from apps.billing.services import credit_grant, price_set
from apps.core.services import snapshot_publish
from apps.models.models import Endpoint, Pool
from apps.models.services import (
    model_create,
    model_version_create,
    model_version_publish,
    pool_create,
    route_set,
)
from apps.scaling.actuators.local import LocalActuator
from apps.scaling.models import ReplicaStart, ScalingDecision
from apps.scaling.services import (
    autoscale_all,
    pool_scaling_get_or_create,
    pool_scaling_update,
    pool_signals_read,
)
from apps.tenants.services import api_key_create, request_class_create, tenant_create
from runtime.artifacts import manifest_digest
from runtime.contract import namespace_of

pytestmark = [pytest.mark.integration, pytest.mark.timing]

MODEL = "ramp-chat"
CAPACITY = 4  # concurrent sequences per replica
OUT_WITHIN_S = 30.0
IN_WITHIN_S = 45.0
IN_COOLDOWN_S = 3.0


@pytest.fixture
def prefix(settings: Any) -> Iterator[str]:
    settings.SNAPSHOT_REDIS_PREFIX = f"switchyard:test:ramp:{uuid.uuid4().hex[:10]}"
    publisher = Publisher(settings.SNAPSHOT_REDIS_PREFIX)
    yield settings.SNAPSHOT_REDIS_PREFIX
    publisher.cleanup()


@pytest.fixture
def world(prefix: str, transactional_db: Any) -> tuple[Pool, str]:
    """A simulator model in a pool with min 1 / max 3, a tenant with a key and credits."""
    request_class_create(
        actor=None, name="standard", priority_band=1, ttft_slo_ms=2_000, deadline_ms=60_000,
        max_queue_length=1_000, shed_order=1,
    )  # fmt: skip
    model = model_create(actor=None, name=MODEL, task="chat")
    files = {"model.safetensors": "ab" * 32}
    version = model_version_create(
        actor=None, model=model, label="v1", artifact_uri="file:///m", runtime="simulator",
        digest=manifest_digest(files),
        manifest={"files": files, "max_context": 2048, "tokenizer": "t", "default_sampling": {}},
    )  # fmt: skip
    version = model_version_publish(actor=None, version=version)
    route_set(actor=None, model=model, splits=[(version, 1)])
    price_set(
        actor=None, version=version, hardware_tier="cpu", input_per_1k=Decimal("0.001"),
        output_per_1k=Decimal("0.001"),
    )  # fmt: skip
    pool = pool_create(
        actor=None, name="ramp", hardware_tier="cpu", cost_per_replica_hour="0", min_replicas=1,
        max_replicas=3,
    )  # fmt: skip
    pool_scaling_update(
        actor=None, scaling=pool_scaling_get_or_create(pool=pool), version_id=version.pk,
        out_cooldown_s=1.0, in_cooldown_s=IN_COOLDOWN_S, idle_to_zero_s=None,
    )  # fmt: skip
    tenant = tenant_create(
        actor=None, slug="acme", name="Acme", rpm_limit=100_000, tpm_limit=100_000_000,
        max_concurrency=1_000, max_context_tokens=2_048, max_output_tokens=512,
        allowed_classes=["standard"], default_class="standard",
    )  # fmt: skip
    _key, secret = api_key_create(actor=None, tenant=tenant, name="ramp")
    credit_grant(actor=None, tenant=tenant, amount=Decimal(10_000), reason="ramp test")
    return pool, secret


@pytest.fixture
def router(world: tuple[Pool, str], prefix: str, tmp_path: Path) -> Iterator[Process]:
    version = snapshot_publish()
    process = start_router(prefix, tmp_path / "router", SWITCHYARD_SCALING_SIGNALS_S="0.2")
    try:
        wait_ready(process, version)
        yield process
    finally:
        process.stop()


class Controller:
    """``autoscale_all`` every ``interval_s`` in a thread until stopped (bounded by ``limit_s``)."""

    def __init__(self, actuator: LocalActuator, namespace: str, interval_s: float = 0.5) -> None:
        self.actuator = actuator
        self.namespace = namespace
        self.interval_s = interval_s
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller", daemon=True)

    def _run(self, limit_s: float = 300.0) -> None:
        client = redis.Redis.from_url(settings.REDIS_URL)
        started = time.monotonic()
        try:
            while not self._stop.wait(self.interval_s) and time.monotonic() - started < limit_s:
                autoscale_all(client=client, actuator=self.actuator, namespace=self.namespace)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
        finally:
            client.close()
            connection.close()  # this thread's database connection

    def __enter__(self) -> Controller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


class Load:
    """``clients`` loops each sending one streamed chat completion after another (read to its
    end); statuses counted."""

    def __init__(self, router: Process, secret: str) -> None:
        self.url = f"{router.base_url}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {secret}", "Cache-Control": "no-store"}
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []
        self.clients = 0

    async def _client(self, http: httpx.AsyncClient, index: int) -> None:
        while index < self.clients:
            # streamed: TTFT counts streams only (issue #33), and the test reads that signal
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 16, "stream": True}  # fmt: skip
            try:
                resp = await http.post(self.url, json=body, headers=self.headers)
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
                continue
            self.statuses[resp.status_code] += 1
            if resp.status_code != 200:
                self.failures.append(f"{resp.status_code} {resp.text[:200]}")

    async def run(self, phases: list[tuple[int, Any]]) -> None:
        """For each (clients, until): keep ``clients`` loops going until ``until()`` (a blocking
        check run in a thread) returns."""
        async with httpx.AsyncClient(timeout=60) as http:
            tasks: list[asyncio.Task[None]] = []
            for clients, until in phases:
                self.clients = clients
                tasks += [
                    asyncio.create_task(self._client(http, i)) for i in range(len(tasks), clients)
                ]
                await asyncio.to_thread(_closing, until)
            self.clients = 0
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)


def _closing(check: Any) -> None:
    """Run ``check`` (it reads the database), then close this thread's connection."""
    try:
        check()
    finally:
        connection.close()


def routed(pool: Pool) -> int:
    return Endpoint.objects.filter(pool=pool, state=Endpoint.State.READY).count()


def test_a_load_ramp_scales_the_pool_out_and_back_in_with_no_failed_request(
    world: tuple[Pool, str], router: Process, prefix: str, tmp_path: Path
) -> None:
    pool, secret = world
    actuator = LocalActuator(
        redis_url=settings.REDIS_URL, namespace=namespace_of(prefix), log_dir=tmp_path / "log",
        capacity=CAPACITY, engine_args=("--decode-a-ms", "40"), start_timeout_s=30,
        drain_timeout_s=30,
    )  # fmt: skip
    load = Load(router, secret)
    marks: dict[str, float] = {}
    try:
        with Controller(actuator, namespace_of(prefix)) as controller:
            eventually(lambda: routed(pool) == 1, timeout=30, what="the pool's minimum replica")

            def scaled_out() -> None:
                marks["high"] = time.monotonic()
                eventually(lambda: routed(pool) >= 2, timeout=OUT_WITHIN_S, interval=0.1,
                           what="a second replica under load")  # fmt: skip
                marks["two"] = time.monotonic()
                eventually(lambda: routed(pool) == 3, timeout=OUT_WITHIN_S, interval=0.1,
                           what="the third replica under load")  # fmt: skip
                marks["three"] = time.monotonic()
                # The router measures first-token times against the class SLO (2 s) under the
                # load. Read from the published signals: a decision's own snapshot of them
                # holds only the last 0.2 s interval, which a slow machine can leave empty.
                client = redis.Redis.from_url(settings.REDIS_URL)
                try:
                    eventually(lambda: "standard" in class_ttfts(client), timeout=OUT_WITHIN_S,
                               interval=0.05, what="the router's TTFT signal")  # fmt: skip
                finally:
                    client.close()
                time.sleep(2.0)  # serve a while on three replicas (the load, not a sync)

            def class_ttfts(client: redis.Redis[bytes]) -> dict[str, float]:
                signals = pool_signals_read(
                    client=client, namespace=namespace_of(prefix), pool=pool.name, now=time.time()
                )
                return signals.ttft_p95_s

            def scaled_in() -> None:
                marks["low"] = time.monotonic()
                eventually(lambda: routed(pool) == 1, timeout=IN_WITHIN_S, interval=0.1,
                           what="back to the minimum after the load fell")  # fmt: skip
                marks["one"] = time.monotonic()

            # 12 clients on one replica of 4 sequences: 8 wait in the router's queue.
            asyncio.run(load.run([(12, scaled_out), (1, scaled_in)]))
        assert not controller.errors, controller.errors
    finally:
        actuator.stop_all(pool)
        actuator.close()
    decisions = list(ScalingDecision.objects.filter(pool=pool).order_by("id"))
    outs = [d for d in decisions if d.action == "out"]
    ins = [d for d in decisions if d.action == "in"]
    assert not [d.error for d in decisions if d.error]
    assert len(ins) == 2, [(d.action, d.current, d.desired, d.reason) for d in decisions]
    assert all(d.stopped == 1 for d in ins)
    assert all(d.signals["pool"] == "ramp" for d in decisions)
    first_in = min(d.created_at for d in ins)
    last_out = max(d.created_at for d in outs)
    assert (first_in - last_out).total_seconds() >= IN_COOLDOWN_S  # slow in
    assert load.failures == [], load.failures[:5]
    assert load.statuses[200] > 20
    starts = list(ReplicaStart.objects.filter(pool=pool).values_list("seconds", flat=True))
    print(
        f"\nramp: 2 replicas {marks['two'] - marks['high']:.1f} s and 3 replicas "
        f"{marks['three'] - marks['high']:.1f} s after the load rose; back to 1 "
        f"{marks['one'] - marks['low']:.1f} s after it fell (in cooldown {IN_COOLDOWN_S} s); "
        f"{load.statuses[200]} requests, 0 failed; cold starts "
        f"{', '.join(f'{s:.2f}' for s in starts)} s"
    )
