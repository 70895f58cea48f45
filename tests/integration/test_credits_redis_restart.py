"""Redis restarts empty under a router: while it is down the router admits paid requests only
within its conservative local share (refusing the rest with 402), spools their settlements,
and replays them once Redis is back; reconciliation re-seeds the balance from the ledger, and
after the ledger consumer ran every answered request has exactly one usage record and the
Redis balance equals the ledger's. A private redis-server, so the restart disturbs nobody."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fixtures.net import free_port
from fixtures.router import Process, Publisher, start_router, start_simulator, wait_ready
from fixtures.wait import eventually
from test_credits import MODEL, chat, world_for

from apps.billing import ledger
from apps.billing.models import UsageRecord
from apps.billing.services import credit_grant
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create
from runtime.contract import credit_key
from runtime.metering.events import decode_event

pytestmark = [pytest.mark.integration, pytest.mark.timing]


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    sim = start_simulator(MODEL, "--decode-a-ms", "5")
    yield sim
    sim.stop()


class PrivateRedis:
    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("no redis-server binary")
        self.binary, self.dir, self.port = binary, directory, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url)
        eventually(client.ping, timeout=10, what="redis-server to answer",
                   ignore=(redis.ConnectionError,))  # fmt: skip
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def test_redis_restart_loses_nothing_and_reconciles(
    engine: Process, tmp_path: Path, transactional_db: Any, settings: Any
) -> None:
    server = PrivateRedis(tmp_path)
    server.start()
    world = world_for(engine)
    publisher = Publisher(f"switchyard:test:restart:{int(time.time() * 1000)}", server.url)
    settings.REDIS_URL = server.url
    settings.SNAPSHOT_REDIS_PREFIX = f"{publisher.prefix}:snapshot"
    router: Process | None = None
    try:
        version = publisher.publish(world.priced())
        router = start_router(publisher.prefix, tmp_path / "router", REDIS_URL=server.url)
        wait_ready(router, version)
        tenant = tenant_create(actor=None, slug="payer", name="Payer", rpm_limit=100_000,
                               tpm_limit=10**9, max_concurrency=1000, max_context_tokens=4096,
                               max_output_tokens=512)  # fmt: skip
        credit_grant(actor=None, tenant=tenant, amount="1", reason="test")
        headers = {"Authorization": f"Bearer {world.secrets['payer']}"}
        url = f"{router.base_url}/v1/chat/completions"

        def post() -> httpx.Response:
            return httpx.post(url, json=chat(), headers=headers, timeout=30)

        stream = f"{publisher.prefix}:usage"
        seen: dict[str, str] = {}  # usage event id -> the request id the client saw

        def in_stream(client: redis.Redis[bytes]) -> set[str]:
            for _id, fields in client.xrange(stream):
                event = decode_event(fields[b"event"])
                seen[event.id] = event.request_id
            return set(seen.values())

        answered: list[str] = []
        first = post()
        assert first.status_code == 200, first.text  # the router learns the balance
        answered.append(first.headers["x-request-id"])
        client = redis.Redis.from_url(server.url)
        eventually(lambda: set(answered) <= in_stream(client), timeout=10, what="first event")
        assert ledger.usage_consume(client=client) == 1  # the consumer keeps up
        client.close()

        server.stop()  # Redis is gone: the local share is 1/2 of what was available
        during = [post() for _ in range(30)]
        ok = [a for a in during if a.status_code == 200]
        refused = [a for a in during if a.status_code == 402]
        assert ok, [a.status_code for a in during]  # served from the local share ...
        assert refused, [a.status_code for a in during]  # ... and no further
        answered += [a.headers["x-request-id"] for a in ok]
        worst = int(Decimal(refused[0].json()["error"]["needed_credits"]) * 1_000_000)
        assert len(ok) * worst <= 1_000_000 // 2

        server.start()  # back, empty
        client = redis.Redis.from_url(server.url)
        eventually(lambda: set(answered) <= in_stream(client), timeout=30,
                   what="the spooled settlements to reach the restarted Redis")  # fmt: skip
        ledger.credit_reconcile(client=client)  # re-bases the balance on the ledger
        while ledger.usage_consume(client=client):
            pass
        assert ledger.credit_reconcile(client=client) == []
        recorded = set(UsageRecord.objects.values_list("event_id", flat=True))
        assert recorded == set(seen)  # one record per answered request, none twice
        assert sorted(seen.values()) == sorted(answered)
        account = Tenant.objects.get(slug="payer").credit_account
        spent = sum(UsageRecord.objects.values_list("credits", flat=True), Decimal(0))
        assert account.balance == Decimal(1) - spent
        balance = int(client.hget(credit_key(f"{publisher.prefix}:limits", "payer"), "balance"))
        assert Decimal(balance) / 1_000_000 == account.balance
        client.close()
    finally:
        if router is not None:
            router.stop()
        publisher.cleanup()
        server.stop()
