"""Crashes on the way to the ledger: kill -9 a router mid-traffic (it restarts on the same
var dir and replays its spool), kill -9 the Celery consumer mid-batch (its entries are
reclaimed). Afterwards every answered request has exactly one usage record, none is doubled,
and the routers' Redis balance agrees with the ledger.

Real processes: two routers, one simulator, Celery workers (solo pool) on a private queue,
PostgreSQL (the test database, committed writes) and Redis."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fixtures.celery_worker import Worker, database_url
from fixtures.router import (
    REPO_ROOT,
    Process,
    redis_url,
    routers,
    start_router,
    start_simulator,
    wait_ready,
)
from fixtures.wait import eventually
from test_credits import MODEL, Priced, chat, world_for

from apps.billing import ledger
from apps.billing.models import UsageRecord
from apps.billing.services import credit_grant
from apps.billing.tasks import usage_consume
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create
from config.celery import app as celery_app
from runtime.contract import USAGE_GROUP, credit_key
from runtime.metering.events import decode_event

assert celery_app  # the tasks below are sent through the project's Celery app (Redis broker)

pytestmark = [pytest.mark.integration, pytest.mark.timing]


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    sim = start_simulator(MODEL, "--decode-a-ms", "20")
    yield sim
    sim.stop()


def _traffic(pair: list[Process], key: str, answers: list[httpx.Response | None]) -> None:
    async def one(http: httpx.AsyncClient, index: int) -> None:
        try:
            answers.append(
                await http.post(f"{pair[index % 2].base_url}/v1/chat/completions", json=chat())
            )
        except httpx.HTTPError:
            answers.append(None)  # its router died

    async def waves() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(timeout=60, headers=headers) as http:
            for wave in range(6):
                await asyncio.gather(*(one(http, wave * 16 + i) for i in range(16)))

    asyncio.run(waves())


def test_crashes_lose_and_double_nothing(
    engine: Process, tmp_path: Path, transactional_db: Any, settings: Any
) -> None:
    world: Priced = world_for(engine)
    queue = f"credits-{uuid.uuid4().hex[:8]}"
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    with routers(world, tmp_path, count=2) as (pair, publisher):
        settings.SNAPSHOT_REDIS_PREFIX = f"{publisher.prefix}:snapshot"  # the routers' namespace
        version = publisher.publish(world.priced())
        for router in pair:
            wait_ready(router, version)
        tenant = tenant_create(actor=None, slug="payer", name="Payer", rpm_limit=100_000,
                               tpm_limit=10**9, max_concurrency=1000, max_context_tokens=4096,
                               max_output_tokens=512)  # fmt: skip
        credit_grant(actor=None, tenant=tenant, amount="1000", reason="test")
        assert ledger.credit_reconcile(client=client) == []  # the grant reached Redis

        # -- traffic; kill -9 router 1 once a third of it is answered, restart it ----------
        answers: list[httpx.Response | None] = []
        sender = threading.Thread(target=_traffic, args=(pair, world.secrets["payer"], answers))
        sender.start()
        eventually(lambda: len(answers) >= 32, timeout=60, what="a third of the traffic")
        pair[1].kill()
        sender.join(timeout=120)
        assert not sender.is_alive()
        restarted = start_router(publisher.prefix, tmp_path / "router-1")
        try:
            wait_ready(restarted, version)
            ok = [a for a in answers if a is not None and a.status_code == 200]
            assert len(ok) >= 48, [None if a is None else a.status_code for a in answers]
            answered = {a.headers["x-request-id"] for a in ok}
            stream = f"{publisher.prefix}:usage"

            def events() -> dict[str, str]:
                out = {}
                for _id, fields in client.xrange(stream):
                    event = decode_event(fields[b"event"])
                    out[event.id] = event.request_id
                return out

            in_stream = eventually(lambda: answered <= set(events().values()) and events(),
                                   timeout=20, what="a usage event for every answer")  # fmt: skip
            assert len(set(in_stream.values())) == len(in_stream)  # no request twice

            # -- the consumer: kill -9 it mid-batch, then a fresh one finishes ----------------
            env = {**os.environ, "DATABASE_URL": database_url(),
                   "SWITCHYARD_SNAPSHOT_PREFIX": f"{publisher.prefix}:snapshot",
                   "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
            first = Worker(queue, env)
            try:
                usage_consume.apply_async(kwargs={"batches": 1}, queue=queue)
                eventually(lambda: "usage_consume" in first.output(), timeout=60,
                           what="the consumer to start its batch")  # fmt: skip
                first.kill()
            finally:
                first.stop()
            second = Worker(queue, env)
            try:

                def drained() -> bool:
                    usage_consume.apply_async(kwargs={"claim_idle_ms": 500}, queue=queue)
                    pending = client.xpending(stream, USAGE_GROUP)["pending"]
                    return client.xlen(stream) == 0 and pending == 0

                eventually(drained, timeout=60, interval=1.0, what="the stream to drain",
                           ignore=(redis.exceptions.ResponseError,))  # fmt: skip
            finally:
                second.stop()
        finally:
            restarted.stop()

        recorded = list(UsageRecord.objects.values_list("event_id", flat=True))
        assert sorted(recorded) == sorted(in_stream)  # exactly once: none lost, none doubled
        assert ledger.credit_reconcile(client=client) == []  # Redis agrees with the ledger
        spent = sum(UsageRecord.objects.values_list("credits", flat=True), Decimal(0))
        tenant = Tenant.objects.get(slug="payer")
        assert tenant.credit_account.balance == Decimal(1000) - spent
        redis_balance = int(client.hget(credit_key(f"{publisher.prefix}:limits", "payer"),
                                        "balance") or 0)  # fmt: skip
        assert Decimal(redis_balance) / 1_000_000 == tenant.credit_account.balance
    client.close()
