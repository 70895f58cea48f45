"""The Batch API end to end with real parts: the unmodified ``openai`` client talks to a real
router process, which forwards files and batches to a real control-plane process (uvicorn,
signed principal); a real Celery worker, fed by a real beat on a private broker, runs the lines
through the router to a simulator engine, in the ``batch`` class, with the batch's own key.

Covered: upload, create, poll to ``completed``, the output line for line by ``custom_id``;
another tenant's ids are 404; a malformed file is refused with its line number; cancel; a
kill -9 of the worker mid-batch still ends with every line exactly once in the output."""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
from django.conf import settings as django_settings
from django.db import connections
from fixtures.celery_worker import Beat, Worker, database_url
from fixtures.control_plane import model_served_by
from fixtures.redis_server import private_redis
from fixtures.router import Process, redis_url, spawn, start_router, wait_ready, wait_until_up
from fixtures.wait import eventually

from apps.batches.models import Batch
from apps.billing.models import UsageRecord
from apps.billing.services import credit_grant, price_set
from apps.tenants.services import api_key_create, request_class_create, tenant_create
from runtime import contract, snapshot_store
from tests.apps.rollouts.support import start_simulator

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MODEL = "tiny-llama"
SECRET = "integration-internal-secret"


@dataclass
class Stage:
    router: Process
    keys: dict[str, str]
    env: dict[str, str]
    workers: list[Worker]
    restart_router: Callable[[], Process]

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router.base_url}/v1", api_key=self.keys[tenant],
                             max_retries=0, timeout=30)  # fmt: skip


def _world(tmp_path: Path, engine: Process) -> dict[str, str]:
    model = model_served_by(engine.base_url, tmp_path / "artifacts" / "v1", name=MODEL)
    price_set(actor=None, version=model.versions.get(), hardware_tier="cpu",
              input_per_1k="1", output_per_1k="2", batch_discount="0.5")  # fmt: skip
    # A 20 s deadline: a retry waits at most that long on a killed router's idempotency claim.
    request_class_create(actor=None, name="batch", priority_band=3, ttft_slo_ms=20_000,
                         deadline_ms=20_000, max_queue_length=1000, shed_order=0)  # fmt: skip
    keys = {}
    for slug in ("acme", "other"):
        tenant = tenant_create(
            actor=None, slug=slug, name=slug, rpm_limit=100_000, tpm_limit=100_000_000,
            max_concurrency=100, max_context_tokens=2048, max_output_tokens=64,
            allowed_classes=["batch"],
        )  # fmt: skip
        credit_grant(actor=None, tenant=tenant, amount="1000", reason="test")
        keys[slug] = api_key_create(actor=None, tenant=tenant, name="k")[1]
    return keys


@pytest.fixture
def stage(settings: Any, tmp_path: Path) -> Iterator[Stage]:
    namespace = f"switchyard:test:batches:{uuid.uuid4().hex[:10]}"
    prefix = f"{namespace}:snapshot"
    settings.SNAPSHOT_REDIS_PREFIX = prefix
    settings.REDIS_URL = redis_url()
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    started: list[Any] = []
    try:
        with private_redis(tmp_path) as broker:
            engine = start_simulator("--decode-a-ms", "20")
            started.append(engine)
            keys = _world(tmp_path, engine)
            env = {
                **os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_url(),
                "CELERY_BROKER_URL": broker.url, "CELERY_RESULT_BACKEND": broker.url,
                contract.ENV_SNAPSHOT_PREFIX: prefix, "SWITCHYARD_VAR_DIR": str(var_dir),
                "SECRET_KEY": django_settings.SECRET_KEY, "SWITCHYARD_INTERNAL_SECRET": SECRET,
                "SWITCHYARD_BATCH_TICK_S": "0.3", "SWITCHYARD_BATCH_LEASE_S": "3",
                "SWITCHYARD_BATCH_CLAIM_SIZE": "4",
                "SWITCHYARD_BEAT_ONLY": "run-batches,drain-snapshot-outbox,usage-stream-to-ledger",
            }  # fmt: skip
            web, _ = spawn(["uvicorn", "config.asgi:application"], env=env)
            started.append(wait_until_up(web, "/v1/batches", ok=(401,)))
            def router_on(port: int | None = None) -> Process:
                process = start_router(
                    prefix, var_dir / "router", port=port,
                    SWITCHYARD_CONTROL_PLANE_URL=web.base_url, SWITCHYARD_INTERNAL_SECRET=SECRET,
                )  # fmt: skip
                started.append(process)
                return process

            router = router_on()
            env["SWITCHYARD_BATCH_ROUTER_URL"] = router.base_url
            workers = [Worker("celery", env)]
            started.append(Beat(env, tmp_path / "beat", max_interval_s=1))
            wait_ready(router, snapshot_store.latest_version(client, prefix=prefix) or 0)
            try:
                def restart() -> Process:  # a new router on the killed one's port
                    again = router_on(router.port)
                    wait_ready(again, snapshot_store.latest_version(client, prefix=prefix) or 0)
                    return again

                yield Stage(router, keys, env, workers, restart)
            finally:
                for worker in workers:
                    print(worker.output()[-3000:])
                    worker.stop()
                connections.close_all()
                for process in reversed(started):
                    if isinstance(process, Beat):
                        print(process.output()[-2000:])
                    process.stop()
    finally:
        left = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if left:
            client.delete(*left)
        client.close()


def _lines(n: int, *, tokens: int = 4) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "max_tokens": tokens,
                             "messages": [{"role": "user", "content": f"line {i}"}]}}).encode()
        + b"\n" for i in range(n)
    )  # fmt: skip


def _status(client: openai.OpenAI, batch_id: str, wanted: set[str]) -> Any:
    batch = client.batches.retrieve(batch_id)
    return batch if batch.status in wanted else None


def _output(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(x) for x in client.files.content(file_id).content.splitlines()]


def _billed(batch_id: str) -> list[tuple[str, str]]:
    try:
        prefix = Batch.objects.get(public_id=batch_id).exec_key_prefix
        rows = UsageRecord.objects.filter(api_key__prefix=prefix)
        return list(rows.values_list("request_class", "outcome"))
    finally:
        connections.close_all()


def _charges(tenant: str) -> list[tuple[str | None, int, int, Decimal]]:
    """The tenant's usage records: (key prefix, tokens in, tokens out, credits)."""
    try:
        rows = UsageRecord.objects.filter(tenant__slug=tenant).order_by("occurred_at")
        return list(rows.values_list("api_key__prefix", "tokens_in", "tokens_out", "credits"))
    finally:
        connections.close_all()


def _price(tokens_in: int, tokens_out: int, keep: Decimal) -> Decimal:
    """1 credit per 1k input tokens, 2 per 1k output, times ``keep`` (micro-credits up)."""
    micro = (tokens_in * 1000 + tokens_out * 2000) * keep
    return Decimal(math.ceil(micro)) / 1_000_000


def _running(batch_id: str) -> bool:
    """Some lines answered and some claimed (in flight) right now."""
    try:
        lines = Batch.objects.get(public_id=batch_id).lines
        return lines.filter(state="done").exists() and lines.filter(state="claimed").exists()
    finally:
        connections.close_all()


def test_openai_client_runs_a_batch_isolation_malformed_and_cancel(stage: Stage) -> None:
    acme, other = stage.client("acme"), stage.client("other")
    upload = acme.files.create(file=("input.jsonl", _lines(6)), purpose="batch")
    assert (upload.purpose, upload.bytes) == ("batch", len(_lines(6)))
    batch = acme.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                completion_window="24h", metadata={"job": "nightly"})  # fmt: skip
    assert batch.status == "in_progress"

    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(upload.id)
    with pytest.raises(openai.BadRequestError, match="Line 2"):
        acme.files.create(file=("bad.jsonl", _lines(1) + b"{oops\n"), purpose="batch")

    done = eventually(lambda: _status(acme, batch.id, {"completed", "failed", "expired"}),
                      timeout=60, what="the batch to complete")  # fmt: skip
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed) == (6, 6)
    assert done.metadata == {"job": "nightly"}
    output = _output(acme, done.output_file_id)
    assert sorted(e["custom_id"] for e in output) == sorted(f"req-{i}" for i in range(6))
    for entry in output:
        assert entry["response"]["status_code"] == 200
        assert entry["response"]["body"]["choices"][0]["message"]["content"]
    assert [b.id for b in acme.batches.list(limit=5).data] == [batch.id]
    # Billed once per line, in the batch class, under the batch's own key.
    assert eventually(lambda: _billed(batch.id) == [("batch", "ok")] * 6, timeout=20,
                      what="the ledger's usage records")  # fmt: skip
    # The price's batch discount (half) on the lines; the full price on an online request.
    acme.chat.completions.create(model=MODEL, max_tokens=4,
                                 messages=[{"role": "user", "content": "line 0"}])  # fmt: skip
    charges = eventually(lambda: (rows := _charges("acme")) and len(rows) == 7 and rows,
                         timeout=20, what="the online request's usage record")  # fmt: skip
    exec_prefix = Batch.objects.get(public_id=batch.id).exec_key_prefix
    for prefix, tokens_in, tokens_out, credits in charges:
        keep = Decimal("0.5") if prefix == exec_prefix else Decimal(1)
        assert credits == _price(tokens_in, tokens_out, keep) > 0, (prefix, credits)
    assert sum(1 for row in charges if row[0] != exec_prefix) == 1

    slow = acme.files.create(file=("slow.jsonl", _lines(30, tokens=40)), purpose="batch")
    running = acme.batches.create(input_file_id=slow.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip
    eventually(lambda: acme.batches.retrieve(running.id).request_counts.completed >= 1,
               timeout=30, what="a first line")  # fmt: skip
    assert acme.batches.cancel(running.id).status == "cancelling"
    cancelled = eventually(lambda: _status(acme, running.id, {"cancelled"}), timeout=30,
                           what="the cancel")  # fmt: skip
    counts = cancelled.request_counts
    assert counts.total == 30
    assert counts.completed + counts.failed == 30
    assert 1 <= counts.completed < 30
    errors = _output(acme, cancelled.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    answered = _output(acme, cancelled.output_file_id)
    assert len({e["custom_id"] for e in answered} | {e["custom_id"] for e in errors}) == 30


def test_a_killed_worker_leaves_every_line_answered_exactly_once(stage: Stage) -> None:
    acme = stage.client("acme")
    upload = acme.files.create(file=("input.jsonl", _lines(24, tokens=40)), purpose="batch")
    batch = acme.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                completion_window="24h")  # fmt: skip
    eventually(lambda: _running(batch.id), timeout=30, what="lines answered and lines running")
    stage.workers[0].kill()  # SIGKILL, mid-batch: its claimed lines keep their lease
    stage.workers.append(Worker("celery", stage.env))
    done = eventually(lambda: _status(acme, batch.id, {"completed", "failed", "expired"}),
                      timeout=90, what="the batch to complete after the kill")  # fmt: skip
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (24, 0)
    ids = [e["custom_id"] for e in _output(acme, done.output_file_id)]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(24))  # each once, none lost
    retried = Batch.objects.get(public_id=batch.id).lines.filter(attempts__gt=1).count()
    assert retried >= 1  # the killed worker's lines ran again
    # Billed once per line: the retried lines carried the first try's Idempotency-Key, and
    # the router (alive, with Redis) served them its stored answer, unbilled.
    eventually(lambda: len(_billed(batch.id)) >= 24, timeout=20, what="the ledger")
    assert len(_billed(batch.id)) == 24


def _ledger_per_line(batch_id: str) -> tuple[list[str], list[str]]:
    """The usage records' event ids under the batch's key, and its lines' usage event ids."""
    try:
        batch = Batch.objects.get(public_id=batch_id)
        rows = UsageRecord.objects.filter(api_key__prefix=batch.exec_key_prefix)
        records = sorted(rows.values_list("event_id", flat=True))
        lines = sorted(batch.lines.values_list("usage_event_id", flat=True))
        return records, lines
    finally:
        connections.close_all()


def test_a_killed_router_leaves_every_line_answered_and_billed_exactly_once(
    stage: Stage,
) -> None:
    acme = stage.client("acme")
    upload = acme.files.create(file=("input.jsonl", _lines(16, tokens=40)), purpose="batch")
    batch = acme.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                completion_window="24h")  # fmt: skip
    eventually(lambda: _running(batch.id), timeout=30, what="lines answered and lines running")
    stage.router.kill()  # SIGKILL mid-batch: its lines in flight die with it
    stage.restart_router()
    done = eventually(lambda: _status(acme, batch.id, {"completed", "failed", "expired"}),
                      timeout=120, what="the batch to complete after the router kill")  # fmt: skip
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (16, 0)
    ids = [e["custom_id"] for e in _output(acme, done.output_file_id)]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(16))  # each once, none lost
    assert Batch.objects.get(public_id=batch.id).lines.filter(attempts__gt=1).exists()
    # Billed once per line, under the line's own event id (the ledger's unique key).
    records, lines = eventually(lambda: (r := _ledger_per_line(batch.id))[0] and
                                len(r[0]) >= 16 and r, timeout=20, what="the ledger")  # fmt: skip
    assert records == lines
    assert len(set(records)) == 16
    assert all(r.startswith("batch-line-") for r in records)
