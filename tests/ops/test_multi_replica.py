"""Many replicas on one machine behave as one deployment (issue #19 item 6).

Real parts throughout: the control plane's services write tenants, a key each, a request
class, a model with a published version, a pool, a ready endpoint (a simulator process),
prices and credit grants to PostgreSQL (the test database, committed) and publish the snapshot
with the real publisher; three router processes (``python -m runtime.gateway``) and two Celery
workers (``celery -A config worker``, the usage-stream consumer) share one Redis.

Mixed traffic (streaming and unary, two tenants) goes through all three routers. Then: one
tenant's RPM limit holds across the routers; the shared fairness counters in Redis hold
exactly what the three routers charged; every router serves the same snapshot version and
follows a publish. One router is killed with SIGKILL; the other two keep serving and following
publishes. Finally the two workers drain the usage stream: one ledger record per served request
(tokens as the responses reported them), the balance is the grant minus the charges, and the
routers' Redis balance reconciles with the ledger.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fixtures.celery_worker import Worker, database_url
from fixtures.control_plane import endpoint_ready, version_published
from fixtures.router import (
    REPO_ROOT,
    Process,
    Publisher,
    http_get,
    redis_url,
    spawn,
    start_router,
    wait_ready,
    wait_until_up,
)
from fixtures.wait import eventually

from apps.billing import ledger
from apps.billing.models import UsageRecord
from apps.billing.services import credit_grant, price_set
from apps.billing.tasks import usage_consume
from apps.core.services import snapshot_publish
from apps.models.services import model_create, pool_create
from apps.tenants.models import Tenant
from apps.tenants.services import api_key_create, request_class_create, tenant_create
from config.celery import app as celery_app
from runtime.artifacts import manifest_digest
from runtime.contract import USAGE_GROUP, credit_key, fairness_key, usage_stream
from runtime.scheduling.interfaces import token_cost

assert celery_app  # usage_consume is sent through the project's Celery app (Redis broker)

pytestmark = [pytest.mark.integration, pytest.mark.timing, pytest.mark.timeout(180)]

ROUTERS = 3
MODEL = "multi-chat"
POOL = "cpu"
BAND = 0
RPM = 12  # acme's limit; it sends 2 * RPM requests, globex (no tight limit) as many
WEIGHTS = {"acme": 2.0, "globex": 1.0}
GRANT = Decimal(1000)
MAX_TOKENS = 6


@dataclass
class Fleet:
    namespace: str
    routers: list[Process]
    workers: list[Worker]
    keys: dict[str, str]
    queue: str
    client: redis.Redis[bytes]


@dataclass
class Served:
    """What the clients saw: per tenant, the status of each request and the usage of the 200s."""

    statuses: dict[str, list[int]] = field(default_factory=lambda: {t: [] for t in WEIGHTS})
    usage: dict[str, list[tuple[int, int]]] = field(
        default_factory=lambda: {t: [] for t in WEIGHTS}
    )
    errors: list[str] = field(default_factory=list)


def _control_plane(engine_url: str) -> dict[str, str]:
    """Everything the routers need, through the services (each publishes on commit)."""
    klass = request_class_create(
        actor=None, name="interactive", priority_band=BAND, ttft_slo_ms=1000, deadline_ms=30_000,
        max_queue_length=256, shed_order=1,
    )  # fmt: skip
    model = model_create(actor=None, name=MODEL, task="chat")
    files = {"model.safetensors": "ab" * 32}
    version = version_published(
        model, "v1", artifact_uri="file:///nonexistent/multi", digest=manifest_digest(files),
        runtime="simulator",
        manifest={"tokenizer": "x", "max_context": 4096, "default_sampling": {}, "files": files},
    )  # fmt: skip
    pool = pool_create(actor=None, name=POOL, hardware_tier="cpu", cost_per_replica_hour="1")
    endpoint_ready(pool, version, engine_url, capacity=64)
    price_set(actor=None, version=version, hardware_tier="cpu", input_per_1k="1",
              output_per_1k="2")  # fmt: skip
    keys = {}
    for slug, weight in WEIGHTS.items():
        tenant = tenant_create(
            actor=None, slug=slug, name=slug.title(), weight=weight,
            rpm_limit=RPM if slug == "acme" else 100_000, tpm_limit=10**9, max_concurrency=1000,
            max_context_tokens=4096, max_output_tokens=512, allowed_classes=[klass],
            default_class=klass,
        )  # fmt: skip
        _key, keys[slug] = api_key_create(actor=None, tenant=tenant, name="multi")
        credit_grant(actor=None, tenant=tenant, amount=GRANT, reason="multi-replica test")
    return keys


@pytest.fixture
def fleet(transactional_db: Any, settings: Any, tmp_path: Path) -> Iterator[Fleet]:
    namespace = f"sytest:ops:multi:{uuid.uuid4().hex[:12]}"
    prefix = f"{namespace}:snapshot"
    settings.SNAPSHOT_REDIS_PREFIX = prefix  # the publisher and the ledger: the routers' namespace
    queue = f"multi-{uuid.uuid4().hex[:8]}"
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_url(),
           "SWITCHYARD_SNAPSHOT_PREFIX": prefix, "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    engine, _ = spawn(["runtime.workers.simulator", "--model", MODEL, "--log-level", "WARNING",
                       "--decode-a-ms", "5"])  # fmt: skip
    workers = [Worker(queue, env) for _ in range(2)]  # they start while the rest is set up
    routers: list[Process] = []
    try:
        keys = _control_plane(engine.base_url)
        version = snapshot_publish()
        for number in range(ROUTERS):  # one by one: a failed start still stops the others
            router = start_router(prefix, tmp_path / f"router-{number}")
            routers.append(router)
        wait_until_up(engine, "/health")
        for router in routers:
            wait_ready(router, version)
        yield Fleet(namespace, routers, workers, keys, queue, client)
    finally:
        for router in routers:
            router.stop()
        for worker in workers:
            worker.stop()
        engine.stop()
        client.delete(queue, f"_kombu.binding.{queue}")
        Publisher(namespace).cleanup()
        client.close()


# -- traffic ---------------------------------------------------------------------------------


async def _one(
    http: httpx.AsyncClient, router: Process, key: str, tenant: str, stream: bool, seen: Served
) -> None:
    body: dict[str, Any] = {
        "model": MODEL, "messages": [{"role": "user", "content": "say a few words"}],
        "max_tokens": MAX_TOKENS, "stream": stream,
    }  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{router.base_url}/v1/chat/completions"
    async with http.stream("POST", url, json=body, headers=headers) as answer:
        raw = await answer.aread()
    seen.statuses[tenant].append(answer.status_code)
    if answer.status_code != 200:
        error = json.loads(raw)["error"]
        if answer.status_code != 429 or error["code"] != "rate_limit_exceeded":
            seen.errors.append(f"{tenant} {answer.status_code} {raw[:300]!r}")
        return
    if stream:
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        usage = json.loads(events[-2])["usage"]
    else:
        usage = json.loads(raw)["usage"]
    seen.usage[tenant].append((usage["prompt_tokens"], usage["completion_tokens"]))


def _traffic(routers: list[Process], keys: dict[str, str], tenants: dict[str, int]) -> Served:
    """``tenants[t]`` requests of each tenant, interleaved: router, framing and tenant vary."""
    seen = Served()
    jobs = [(t, i) for i in range(max(tenants.values())) for t in tenants if i < tenants[t]]

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            for start in range(0, len(jobs), 12):  # waves of 12 concurrent requests
                await asyncio.gather(*(
                    _one(http, routers[n % len(routers)], keys[t], t, i % 2 == 0, seen)
                    for n, (t, i) in enumerate(jobs[start : start + 12], start)
                ))  # fmt: skip

    asyncio.run(run())
    assert not seen.errors, seen.errors
    return seen


# -- what the routers and Redis say -----------------------------------------------------------


def _served_tokens(router: Process, tenant: str) -> tuple[int, int]:
    """(input, output) tokens the router charged ``tenant`` in the pool (its /metrics)."""
    status, body = http_get(f"{router.base_url}/metrics")
    assert status == 200
    found = {"input": 0, "output": 0}
    for line in body.decode().splitlines():
        head, _, value = line.rpartition(" ")
        if head.startswith("switchyard_served_tokens_total{") and all(
            label in head for label in (f'tenant="{tenant}"', f'pool="{POOL}"')
        ):
            found["input" if 'kind="input"' in head else "output"] = int(float(value))
    return found["input"], found["output"]


def _versions(routers: list[Process]) -> set[int]:
    return {json.loads(http_get(f"{r.base_url}/readyz")[1])["snapshot_version"] for r in routers}


def test_three_routers_two_workers_one_deployment(fleet: Fleet) -> None:
    routers, client, ns = fleet.routers, fleet.client, fleet.namespace

    # -- mixed traffic through all three routers; acme's RPM limit holds globally ----------
    first = _traffic(routers, fleet.keys, {"acme": 2 * RPM, "globex": 2 * RPM})
    assert first.statuses["acme"].count(200) == RPM, first.statuses["acme"]
    assert first.statuses["acme"].count(429) == RPM
    assert first.statuses["globex"] == [200] * (2 * RPM)

    # -- the shared fairness counters hold what all three routers charged -----------------
    def charged(tenant: str) -> list[float]:
        return [token_cost(*_served_tokens(r, tenant)) / WEIGHTS[tenant] for r in routers]

    assert all(cost > 0 for cost in charged("globex"))  # every router served globex
    for tenant in WEIGHTS:

        def synced(tenant: str = tenant) -> bool:
            shared = client.hget(fairness_key(f"{ns}:fairness", POOL), f"{BAND}|{tenant}")
            return shared is not None and float(shared) == pytest.approx(sum(charged(tenant)))

        eventually(synced, timeout=10, interval=0.2, what=f"{tenant}'s shared fairness counter")

    # -- one snapshot version everywhere; a publish reaches every router ------------------
    assert len(_versions(routers)) == 1
    newer = snapshot_publish()
    eventually(lambda: _versions(routers) == {newer}, timeout=5, what="every router on it")

    # All usage events are in the stream before a router dies (nothing waits in its spool).
    served = first.statuses["acme"].count(200) + len(first.usage["globex"])
    eventually(lambda: client.xlen(usage_stream(ns)) == served, timeout=10, what="usage events")

    # -- kill -9 one router: the other two keep serving and following publishes -----------
    routers[0].kill()
    survivors = routers[1:]
    after = _traffic(survivors, fleet.keys, {"globex": 8})
    assert after.statuses["globex"] == [200] * 8
    newest = snapshot_publish()
    eventually(lambda: _versions(survivors) == {newest}, timeout=5, what="survivors follow")

    # -- the two Celery workers drain the usage stream into the ledger -------------------
    for worker in fleet.workers:
        eventually(lambda w=worker: " ready." in w.output(), timeout=60, what="a worker ready")

    def drained() -> bool:
        for _ in fleet.workers:  # one task each: prefetch 1, solo pool
            usage_consume.apply_async(kwargs={"claim_idle_ms": 1000}, queue=fleet.queue)
        pending = client.xpending(usage_stream(ns), USAGE_GROUP)["pending"]
        return client.xlen(usage_stream(ns)) == 0 and pending == 0

    eventually(drained, timeout=30, interval=0.5, what="the usage stream drained",
               ignore=(redis.exceptions.ResponseError,))  # fmt: skip

    def both_consume() -> bool:  # the stream is shared; each worker takes turns on the queue
        usage_consume.apply_async(queue=fleet.queue)
        return all("usage_consume" in w.output() and "succeeded" in w.output()
                   for w in fleet.workers)  # fmt: skip

    eventually(both_consume, timeout=20, interval=0.5, what="both workers consuming")

    for tenant in WEIGHTS:
        records = UsageRecord.objects.filter(tenant__slug=tenant)
        responses = first.usage[tenant] + after.usage[tenant]
        assert records.count() == len(responses)  # one record per served request
        assert sorted(records.values_list("tokens_in", "tokens_out")) == sorted(responses)
        spent = sum(records.values_list("credits", flat=True), Decimal(0))
        expected = sum(Decimal(i) / 1000 + Decimal(2 * o) / 1000 for i, o in responses)
        assert spent == expected
        account = Tenant.objects.get(slug=tenant).credit_account
        assert account.balance == GRANT - spent
        raw = client.hget(credit_key(f"{ns}:limits", tenant), "balance")
        assert Decimal(int(raw or 0)) / 1_000_000 == account.balance
    assert ledger.credit_reconcile(client=client) == []  # Redis agrees with the ledger
    print(f"served {served} + 8 requests; shared fairness counters of {ROUTERS} routers: "
          f"{client.hgetall(fairness_key(f'{ns}:fairness', POOL))}")  # fmt: skip
