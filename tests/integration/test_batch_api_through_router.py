"""The Batch API end to end with real parts: the unmodified ``openai`` client talks to a real
router process, which forwards files and batches to a real control-plane process (uvicorn,
signed principal); a real Celery worker, fed by a real beat on a private broker, runs the lines
through the router to a simulator engine, in the ``batch`` class, with the batch's own key.

Covered: upload, create, poll to ``completed``, the output line for line by ``custom_id``,
the files sealed in an S3-compatible store (moto's server: ``SWITCHYARD_BATCH_STORAGE``);
another tenant's ids are 404; a malformed file is refused with its line number; cancel; an
embeddings batch billed once per line; a kill -9 of the worker mid-batch still ends with
every line exactly once in the output; a tenant at its online concurrency cap while its
batch runs gets no 429 (the batch lane); a router killed mid-batch, and then Redis emptied
mid-batch (usage events waiting in the stream lost with it), still end with every line
answered once and billed once under its own event id; embeddings lines caught in flight by a
kill -9 of the worker and then of the router (a slow embedding engine) end the same way. The
stage has a Redis of its own (the data plane's, which a test empties) besides the broker's."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
from django.conf import settings as django_settings
from django.db import connections
from django.utils import timezone
from fixtures.celery_worker import Beat, Worker, database_url
from fixtures.control_plane import (
    endpoint_ready,
    interactive_class,
    model_served_by,
    version_published,
)
from fixtures.redis_server import private_redis
from fixtures.router import Process, spawn, start_router, wait_ready, wait_until_up
from fixtures.s3_server import S3Bucket, s3_bucket
from fixtures.wait import eventually

from apps.batches.models import Batch
from apps.billing import ledger
from apps.billing.models import CreditAccount, UsageRecord
from apps.billing.services import credit_grant, price_set
from apps.common.models import AuditEvent
from apps.models.models import Pool
from apps.models.services import model_create, route_set
from apps.tenants.services import api_key_create, request_class_create, tenant_create
from config.embedded import EmbeddedRedis
from runtime import contract, snapshot_store
from runtime.crypto import MAGIC
from tests.apps.rollouts.support import artifact, start_simulator

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MODEL = "tiny-llama"
EMBED = "tiny-embed"
SECRET = "integration-internal-secret"
S3_PREFIX = "switchyard"
SLOW = 120  # lines of the batch that is cancelled while it runs


@dataclass
class Stage:
    router: Process
    keys: dict[str, str]
    env: dict[str, str]
    workers: list[Worker]
    restart_router: Callable[[], Process]
    data: EmbeddedRedis  # the routers' and the control plane's Redis (the broker is another)
    beats: list[Beat]
    start_beat: Callable[[], Beat]
    started: list[Any]  # processes stopped at the end
    s3: S3Bucket  # where the control plane stores the files

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
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    started: list[Any] = []
    # A Redis of its own (a test empties it), and another one as Celery's broker.
    with (private_redis(tmp_path / "data") as data, private_redis(tmp_path) as broker,
          s3_bucket("batch-files") as s3):  # fmt: skip
        settings.REDIS_URL = data.url
        client: redis.Redis[bytes] = redis.Redis.from_url(data.url)
        engine = start_simulator("--decode-a-ms", "20")
        started.append(engine)
        keys = _world(tmp_path, engine)
        env = {
            **os.environ, "DATABASE_URL": database_url(), "REDIS_URL": data.url,
            "CELERY_BROKER_URL": broker.url, "CELERY_RESULT_BACKEND": broker.url,
            contract.ENV_SNAPSHOT_PREFIX: prefix, "SWITCHYARD_VAR_DIR": str(var_dir),
            "SECRET_KEY": django_settings.SECRET_KEY, "SWITCHYARD_INTERNAL_SECRET": SECRET,
            "SWITCHYARD_BATCH_TICK_S": "0.3", "SWITCHYARD_BATCH_LEASE_S": "3",
            "SWITCHYARD_BATCH_CLAIM_SIZE": "4",
            "SWITCHYARD_BATCH_BILL_EVERY_S": "1", "SWITCHYARD_BATCH_BILL_GRACE_S": "3",
            "SWITCHYARD_BEAT_ONLY": "run-batches,drain-snapshot-outbox,usage-stream-to-ledger,"
                                    "bill-batch-lines",
            **s3.env(S3_PREFIX),  # the files in an S3-compatible store (moto's server)
        }  # fmt: skip
        web, _ = spawn(["uvicorn", "config.asgi:application"], env=env)
        started.append(wait_until_up(web, "/v1/batches", ok=(401,)))

        def router_on(port: int | None = None) -> Process:
            process = start_router(
                prefix, var_dir / "router", port=port, REDIS_URL=data.url,
                SWITCHYARD_CONTROL_PLANE_URL=web.base_url, SWITCHYARD_INTERNAL_SECRET=SECRET,
            )  # fmt: skip
            started.append(process)
            return process

        router = router_on()
        env["SWITCHYARD_BATCH_ROUTER_URL"] = router.base_url
        workers = [Worker("celery", env)]
        beats: list[Beat] = []

        def beat() -> Beat:
            beats.append(Beat(env, tmp_path / f"beat-{len(beats)}", max_interval_s=1))
            return beats[-1]

        beat()
        wait_ready(router, snapshot_store.latest_version(client, prefix=prefix) or 0)
        try:

            def restart() -> Process:  # a new router on the killed one's port
                again = router_on(router.port)
                wait_ready(again, snapshot_store.latest_version(client, prefix=prefix) or 0)
                return again

            yield Stage(router, keys, env, workers, restart, data, beats, beat, started, s3)
        finally:
            for worker in workers:
                print(worker.output()[-3000:])
                worker.stop()
            connections.close_all()
            for running in beats:
                print(running.output()[-2000:])
                running.stop()
            for process in reversed(started):
                process.stop()
            client.close()


def _lines(n: int, *, tokens: int = 4) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "max_tokens": tokens,
                             "messages": [{"role": "user", "content": f"line {i}"}]}}).encode()
        + b"\n" for i in range(n)
    )  # fmt: skip


def _embedding_lines(n: int) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": EMBED, "input": [f"text {i}", "and more"]}}).encode()
        + b"\n" for i in range(n)
    )  # fmt: skip


def _embeddings_served(tmp_path: Path, *args: str) -> Process:
    """An embedding model on a simulator of its own (in the pool of the chat model), priced:
    published to the routers by the beat's outbox drain. ``args``: the simulator's flags."""
    engine = start_simulator(*args, model=EMBED)
    model = model_create(actor=None, name=EMBED, task="embedding")
    version = version_published(model, "v1", runtime="vllm",
                                **artifact(tmp_path / "artifacts" / "embed"))  # fmt: skip
    endpoint_ready(Pool.objects.get(name="sim"), version, engine.base_url)
    route_set(actor=None, model=model, splits=[(version, 100)])
    price_set(actor=None, version=version, hardware_tier="cpu", input_per_1k="1",
              output_per_1k="2")  # fmt: skip
    return engine


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


def _unfinished(batch_id: str) -> bool:
    """Some lines not answered yet (pending, or claimed: none is claimed for a moment between
    two claims of the executor)."""
    try:
        lines = Batch.objects.get(public_id=batch_id).lines
        return lines.filter(state__in=("pending", "claimed")).exists()
    finally:
        connections.close_all()


def _kill_worker_mid_line(stage: Stage, batch_id: str) -> dict[int, str]:
    """SIGKILL the executor's worker while it holds lines of the batch in flight, whatever the
    machine's load: frozen (SIGSTOP) until the database shows it holding some (thawed and
    tried again while it holds none: between two claims), then killed; those lines."""
    worker = stage.workers[-1]

    def frozen_holding() -> dict[int, str]:
        worker.proc.send_signal(signal.SIGSTOP)
        held = _in_flight(batch_id)
        if not held:
            worker.proc.send_signal(signal.SIGCONT)
        return held

    held = eventually(frozen_holding, timeout=30, interval=0.1,
                      what="the worker frozen with lines in flight")  # fmt: skip
    worker.kill()
    return held


def _kill_router_mid_line(
    stage: Stage, batch_id: str, owner: Callable[[str], bool] = bool
) -> dict[int, str]:
    """SIGKILL the router while lines of the batch (sent by an ``owner`` executor) are in
    flight there, whatever the machine's load: frozen (SIGSTOP) first, killed once the same
    lines stay claimed over three polls (their executor waits on the frozen router for them;
    one answered just before the freeze is recorded meanwhile); those lines."""
    os.killpg(stage.router.pid, signal.SIGSTOP)
    polls: list[dict[int, str]] = []

    def held_there() -> dict[int, str]:
        polls.append({k: v for k, v in _in_flight(batch_id).items() if owner(v)})
        first, *rest = polls[-3:]
        return first if len(rest) == 2 and all(p == first for p in rest) else {}

    held = eventually(held_there, timeout=30, interval=0.2,
                      what="lines held at the frozen router")  # fmt: skip
    stage.router.kill()
    return held


def test_openai_client_runs_a_batch_isolation_malformed_and_cancel(
    stage: Stage, tmp_path: Path
) -> None:
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
    # Input and output are objects in the S3 bucket, sealed (no plaintext of a line).
    keys = {f"{S3_PREFIX}/acme/{file_id}.jsonl" for file_id in (upload.id, done.output_file_id)}
    assert keys <= set(stage.s3.keys())
    for key in keys:
        assert stage.s3.object(key).startswith(MAGIC)
        assert b"custom_id" not in stage.s3.object(key)
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

    # Long enough (4 lines at a time, 0.8 s each: 24 s at least) that the cancel lands before
    # its end even when the test's requests are slow on a loaded machine.
    slow = acme.files.create(file=("slow.jsonl", _lines(SLOW, tokens=40)), purpose="batch")
    running = acme.batches.create(input_file_id=slow.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip
    eventually(lambda: acme.batches.retrieve(running.id).request_counts.completed >= 1,
               timeout=30, what="a first line")  # fmt: skip
    assert acme.batches.cancel(running.id).status == "cancelling"
    cancelled = eventually(lambda: _status(acme, running.id, {"cancelled"}), timeout=30,
                           what="the cancel")  # fmt: skip
    counts = cancelled.request_counts
    assert counts.total == SLOW
    assert counts.completed + counts.failed == SLOW
    assert 1 <= counts.completed < SLOW
    errors = _output(acme, cancelled.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    answered = _output(acme, cancelled.output_file_id)
    assert len({e["custom_id"] for e in answered} | {e["custom_id"] for e in errors}) == SLOW

    # Embeddings lines (which the router's Idempotency-Key skips) are billed once per line
    # too, under the line's event id.
    stage.started.append(_embeddings_served(tmp_path))
    eventually(lambda: acme.embeddings.create(model=EMBED, input="warm"), timeout=30,
               ignore=(openai.NotFoundError,), what="the router to serve " + EMBED)  # fmt: skip
    upload = acme.files.create(file=("embed.jsonl", _embedding_lines(6)), purpose="batch")
    embedded = acme.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                   completion_window="24h")  # fmt: skip
    for entry in _completed(acme, embedded.id, 6, custom="emb"):
        assert len(entry["response"]["body"]["data"]) == 2  # an embedding per input


def test_a_killed_worker_leaves_every_line_answered_exactly_once_chat_and_embeddings(
    stage: Stage, tmp_path: Path
) -> None:
    acme = stage.client("acme")
    upload = acme.files.create(file=("input.jsonl", _lines(24, tokens=40)), purpose="batch")
    batch = acme.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                completion_window="24h")  # fmt: skip
    eventually(lambda: _running(batch.id), timeout=30, what="lines answered and lines running")
    _kill_worker_mid_line(stage, batch.id)  # SIGKILL, mid-batch: its lines keep their lease
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

    _allowance(stage)
    _embeddings_across_kills(stage, tmp_path)


def _chat_status(client: openai.OpenAI) -> int:
    """One interactive chat request (about 0.8 s at the engine); its HTTP status."""
    try:
        client.chat.completions.create(model=MODEL, max_tokens=40,
                                       messages=[{"role": "user", "content": "now"}])  # fmt: skip
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


def _at_the_cap(client: openai.OpenAI, cap: int, rounds: int) -> list[int]:
    """``rounds`` bursts of ``cap`` concurrent interactive requests: the tenant at its online
    concurrency cap; their statuses."""
    statuses: list[int] = []
    with ThreadPoolExecutor(max_workers=cap) as pool:
        for _ in range(rounds):
            statuses += pool.map(lambda _: _chat_status(client), range(cap))
    return statuses


def _allowance(stage: Stage) -> None:
    """A tenant at its online concurrency cap (2) while its batch runs (up to 4 lines in flight,
    in its batch lane) gets no 429: the batch takes nothing from the online caps."""
    tenant = tenant_create(
        actor=None, slug="capped", name="capped", rpm_limit=100_000, tpm_limit=100_000_000,
        max_concurrency=2, max_context_tokens=2048, max_output_tokens=64,
        allowed_classes=[interactive_class().name, "batch"], default_class="interactive",
    )  # fmt: skip
    credit_grant(actor=None, tenant=tenant, amount="1000", reason="test")
    key = api_key_create(actor=None, tenant=tenant, name="k")[1]
    client = openai.OpenAI(base_url=f"{stage.router.base_url}/v1", api_key=key, max_retries=0,
                           timeout=30)  # fmt: skip
    eventually(client.models.list, timeout=30, ignore=(openai.AuthenticationError,),
               what="the router to know the new tenant")  # fmt: skip
    upload = client.files.create(file=("capped.jsonl", _lines(40, tokens=40)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip
    eventually(lambda: _running(batch.id), timeout=30, what="the capped tenant's batch to run")
    statuses = _at_the_cap(client, cap=2, rounds=3)
    unfinished = _unfinished(batch.id)
    assert statuses == [200] * 6
    assert unfinished  # the bursts ran beside the batch's lines, to the end
    _completed(client, batch.id, 40)


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


def _waiting_in_stream(batch_id: str) -> int:
    """The batch's answered lines whose usage event waits in the stream, not in the ledger."""
    try:
        waiting = ledger.usage_stream_ids(ledger.redis_client())
        batch = Batch.objects.get(public_id=batch_id)
        done = set(batch.lines.filter(state="done").values_list("usage_event_id", flat=True))
        return len(done & waiting)
    finally:
        connections.close_all()


def _lose_redis(data: EmbeddedRedis) -> None:
    """A Redis restart that keeps nothing (as without persistence): killed, emptied, started
    again on its port. Nothing seeds the balances again here (this stage's beat runs no
    ``credit_reconcile``): the router refuses lines 402 until the executor does."""
    data.kill()
    shutil.rmtree(data.data_dir)
    data.start()


def _reconciled(tenant: str) -> bool:
    """Whether a balance reconciliation repaired the tenant's balance (audited)."""
    try:
        account = CreditAccount.objects.get(tenant__slug=tenant)
        return AuditEvent.objects.filter(action="credit.reconcile",
                                         target_id=str(account.pk)).exists()  # fmt: skip
    finally:
        connections.close_all()


def _completed(client: openai.OpenAI, batch_id: str, n: int, custom: str = "req") -> list[Any]:
    """The batch completes with every line answered once, and each is billed once, under its
    own event id (the ledger's unique key)."""
    done = eventually(lambda: _status(client, batch_id, {"completed", "failed", "expired"}),
                      timeout=120, what="the batch to complete")  # fmt: skip
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
    ids = [e["custom_id"] for e in _output(client, done.output_file_id)]
    assert sorted(ids) == sorted(f"{custom}-{i}" for i in range(n))  # each once, none lost
    records, lines = eventually(lambda: (r := _ledger_per_line(batch_id))[0] and
                                len(r[0]) >= n and r, timeout=20, what="the ledger")  # fmt: skip
    assert records == lines
    assert len(set(records)) == n
    assert all(r.startswith("batch-line-") for r in records)
    return _output(client, done.output_file_id)


def test_a_killed_router_or_a_lost_redis_leave_every_line_answered_and_billed_exactly_once(
    stage: Stage,
) -> None:
    acme = stage.client("acme")
    upload = acme.files.create(file=("input.jsonl", _lines(16, tokens=40)), purpose="batch")
    batch = acme.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                completion_window="24h")  # fmt: skip
    eventually(lambda: _running(batch.id), timeout=30, what="lines answered and lines running")
    in_flight = _kill_router_mid_line(stage, batch.id)  # SIGKILL: its lines in flight die
    stage.restart_router()
    _completed(acme, batch.id, 16)
    assert _ran_again(batch.id, set(in_flight)) >= 1

    # Redis loses everything mid-batch, the usage stream's unread tail with it: the lines it
    # held are billed from their answers (apps/batches/services/unbilled.py), once.
    upload = acme.files.create(file=("again.jsonl", _lines(24, tokens=40)), purpose="batch")
    again = acme.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                completion_window="24h")  # fmt: skip
    eventually(lambda: _running(again.id), timeout=30, what="lines answered and lines running")
    stage.beats[-1].stop()  # no usage consumer from now on; the executor's running tick goes on
    eventually(lambda: _waiting_in_stream(again.id) >= 2, timeout=30,
               what="answered lines whose usage events wait in the stream")  # fmt: skip
    stage.workers[-1].kill()  # and the tick stops (SIGKILL): its lines in flight keep a lease
    _lose_redis(stage.data)
    # The empty Redis refuses the lines 402 (no balance): the ledger says acme has credits, so
    # the executor reconciles the balances at once and the lines run again: no grant, no wait
    # for the beat's reconciliation or the pause's 5-minute probe.
    stage.workers.append(Worker("celery", stage.env))
    stage.start_beat()
    _completed(acme, again.id, 24)
    assert _reconciled("acme")


def _in_flight(batch_id: str) -> dict[int, str]:
    """The batch's lines claimed under a live lease right now (sent, not yet answered): their
    ids and the executor (lease owner) holding each."""
    try:
        lines = Batch.objects.get(public_id=batch_id).lines.filter(
            state="claimed", lease_expires_at__gt=timezone.now()
        )
        return dict(lines.values_list("id", "lease_owner"))
    finally:
        connections.close_all()


def _ran_again(batch_id: str, ids: set[int]) -> int:
    """How many of the lines ``ids`` were sent more than once."""
    try:
        lines = Batch.objects.get(public_id=batch_id).lines
        return lines.filter(pk__in=ids, attempts__gt=1).count()
    finally:
        connections.close_all()


def _embeddings_across_kills(stage: Stage, tmp_path: Path) -> None:
    """Embeddings lines, which the router's Idempotency-Key skips, are caught in flight by a
    kill -9 of the executor's worker and then of the router (the engine prefills 16 tokens/s:
    a line of 4 tokens takes a quarter of a second, 4 run at once); every line ends once in
    the output and once in the ledger, under its own event id."""
    acme = stage.client("acme")
    stage.started.append(_embeddings_served(tmp_path, "--prefill-tps", "16"))
    eventually(lambda: acme.embeddings.create(model=EMBED, input="warm"), timeout=30,
               ignore=(openai.NotFoundError,), what="the router to serve " + EMBED)  # fmt: skip
    upload = acme.files.create(file=("embed.jsonl", _embedding_lines(16)), purpose="batch")
    batch = acme.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                completion_window="24h")  # fmt: skip
    eventually(lambda: _running(batch.id), timeout=30, what="lines answered and lines running")
    # SIGKILL: its lines in flight keep their lease, then run again
    at_worker_kill = _kill_worker_mid_line(stage, batch.id)
    stage.workers.append(Worker("celery", stage.env))
    killed = set(at_worker_kill.values())
    eventually(lambda: {k: v for k, v in _in_flight(batch.id).items() if v not in killed},
               timeout=30, what="the new worker's lines in flight")  # fmt: skip
    # SIGKILL: the lines it was serving die with it
    at_router_kill = _kill_router_mid_line(stage, batch.id, lambda owner: owner not in killed)
    stage.router = stage.restart_router()
    for entry in _completed(acme, batch.id, 16, custom="emb"):
        assert len(entry["response"]["body"]["data"]) == 2
    # The kills caught lines in flight: they were sent again, and still answered and billed once.
    assert at_worker_kill
    assert _ran_again(batch.id, set(at_worker_kill)) >= 1
    assert _ran_again(batch.id, set(at_router_kill)) >= 1
