"""The Batch API's views and services on the control plane: uploads checked line by line,
batches refused with the line number, per-line errors in the error file, tenant isolation,
the signed principal, and the executor's lease / record / finalize cycle."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from batch_support import Signed, jsonl, line, make_tenant
from django.conf import settings as django_settings
from django.utils import timezone

from apps.batches import executor
from apps.batches.models import Batch, BatchLine, File
from apps.batches.services import (
    batch_cancel,
    batch_finalize,
    file_read,
    line_record,
    lines_claim,
)
from apps.batches.services.lines import fair_shares
from apps.batches.services.pause import PROBE_AFTER_S, batches_resume_due
from apps.billing import ledger
from apps.billing.services import credit_grant
from apps.common.models import AuditEvent
from apps.tenants.models import ApiKey, Tenant
from runtime.contract import credit_key

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def _error(resp: Any) -> dict[str, Any]:
    error: dict[str, Any] = resp.json()["error"]
    return error


def _create(acme: Signed, content: bytes) -> Any:
    uploaded = acme.upload(content)
    assert uploaded.status_code == 200, uploaded.content
    return acme.post_json("/v1/batches", {
        "input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": {"job": "t"},
    })  # fmt: skip


def test_unsigned_and_forged_requests_are_refused(tenant: Tenant) -> None:
    acme = Signed("acme")
    assert acme.client.get("/v1/batches").status_code == 401
    headers = acme.headers("GET", "/v1/files")  # signed for another path
    resp = acme.client.get("/v1/batches", headers=headers)
    assert resp.status_code == 401
    assert _error(resp)["code"] == "invalid_principal"


@pytest.mark.parametrize(
    ("content", "status", "code", "line_no"),
    [
        (jsonl(line("a"), b"{not json"), 400, "invalid_jsonl", 2),
        (jsonl(line("a"), b'{"custom_id": "b", "method": "GET"}'), 400, "invalid_jsonl", 2),
        (jsonl(b'{"custom_id": "a", "method": "POST", "url": "/v1/x", "body": {}}'),
         400, "invalid_jsonl", 1),
        (b"\n\n", 400, "empty_file", None),
    ],
)  # fmt: skip
def test_a_malformed_upload_is_refused_with_its_line(
    tenant: Tenant, content: bytes, status: int, code: str, line_no: int | None
) -> None:
    resp = Signed("acme").upload(content)
    assert resp.status_code == status
    error = _error(resp)
    assert (error["code"], error.get("line")) == (code, line_no)
    assert not File.objects.exists()


def test_upload_caps(tenant: Tenant, settings: Any) -> None:
    settings.BATCH_MAX_LINES = 2
    resp = Signed("acme").upload(jsonl(line("a"), line("b"), line("c")))
    assert (resp.status_code, _error(resp)["code"]) == (400, "too_many_lines")
    settings.BATCH_MAX_FILE_BYTES = 10
    resp = Signed("acme").upload(jsonl(line("a")))
    assert (resp.status_code, _error(resp)["code"]) == (413, "file_too_large")
    resp = Signed("acme").upload(jsonl(line("a")), purpose="fine-tune")
    assert (resp.status_code, _error(resp)["code"]) == (400, "invalid_purpose")


@pytest.mark.parametrize(
    ("second", "code"),
    [
        (line("b", url="/v1/completions"), "mismatched_endpoint"),
        (line("a"), "duplicate_custom_id"),
    ],
)
def test_a_malformed_batch_is_refused_before_any_line_runs(
    tenant: Tenant, second: bytes, code: str
) -> None:
    resp = _create(Signed("acme"), jsonl(line("a"), second))
    assert resp.status_code == 400
    assert (_error(resp)["code"], _error(resp)["line"]) == (code, 2)
    assert not Batch.objects.exists()


def test_lines_that_cannot_run_go_to_the_error_file_and_the_others_run(tenant: Tenant) -> None:
    acme = Signed("acme")
    content = jsonl(line("ok"), line("ghost", model="nope"), line("big", max_tokens=999))
    resp = _create(acme, content)
    assert resp.status_code == 200, resp.content
    created = resp.json()
    assert created["status"] == "in_progress"
    assert created["request_counts"] == {"total": 3, "completed": 0, "failed": 2}
    batch = Batch.objects.get(public_id=created["id"])
    assert ApiKey.objects.get(prefix=batch.exec_key_prefix).tenant == tenant

    (claimed,) = lines_claim(owner="w1", limit=10, lease_s=60)
    assert claimed.custom_id == "ok"
    answer = {"choices": [{"message": {"content": "hi"}}]}
    assert line_record(line_id=claimed.pk, owner="w1", status_code=200, body=answer,
                       request_id="batch-1-1")  # fmt: skip
    finished = batch_finalize(batch_id=batch.pk)
    assert finished is not None
    assert finished.status == "completed"
    assert ApiKey.objects.get(prefix=batch.exec_key_prefix).revoked_at is not None

    view = acme.get(f"/v1/batches/{batch.public_id}").json()
    assert view["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    out = acme.get(f"/v1/files/{view['output_file_id']}/content")
    (entry,) = [json.loads(x) for x in out.content.splitlines()]
    assert (entry["custom_id"], entry["response"]["body"]) == ("ok", answer)
    errors = [json.loads(x) for x in acme.get(
        f"/v1/files/{view['error_file_id']}/content").content.splitlines()]  # fmt: skip
    assert [(e["custom_id"], e["error"]["code"], e["error"]["line"]) for e in errors] == [
        ("ghost", "model_not_found", 2), ("big", "max_tokens_exceeded", 3),
    ]  # fmt: skip


def test_another_tenants_ids_are_404(tenant: Tenant) -> None:
    make_tenant("other")
    created = _create(Signed("acme"), jsonl(line("a"))).json()
    other = Signed("other")
    assert other.get(f"/v1/batches/{created['id']}").status_code == 404
    assert other.get(f"/v1/files/{created['input_file_id']}").status_code == 404
    assert other.get(f"/v1/files/{created['input_file_id']}/content").status_code == 404
    assert other.delete(f"/v1/files/{created['input_file_id']}").status_code == 404
    assert other.post_json(f"/v1/batches/{created['id']}/cancel", {}).status_code == 404
    resp = other.post_json("/v1/batches", {"input_file_id": created["input_file_id"],
        "endpoint": "/v1/chat/completions", "completion_window": "24h"})  # fmt: skip
    assert resp.status_code == 404
    assert other.get("/v1/batches").json()["data"] == []


def test_bad_batch_parameters(tenant: Tenant) -> None:
    acme = Signed("acme")
    file_id = acme.upload(jsonl(line("a"))).json()["id"]
    base = {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}  # fmt: skip
    for change, code in [({"endpoint": "/v1/x"}, "invalid_endpoint"),
                         ({"completion_window": "1h"}, "invalid_completion_window"),
                         ({"metadata": {"a": 1}}, "invalid_metadata"),
                         ({"input_file_id": None}, "invalid_input_file")]:  # fmt: skip
        resp = acme.post_json("/v1/batches", base | change)
        assert (resp.status_code, _error(resp)["code"]) == (400, code)
    resp = acme.client.post("/v1/batches", b"[", content_type="application/json",
                            headers=acme.headers("POST", "/v1/batches"))  # fmt: skip
    assert (resp.status_code, _error(resp)["code"]) == (400, "invalid_json")
    assert acme.get("/v1/batches", limit="0").status_code == 400
    resp = acme.delete("/v1/batches")
    assert (resp.status_code, _error(resp)["code"]) == (405, "method_not_allowed")


def test_list_pages_with_a_cursor(tenant: Tenant) -> None:
    acme = Signed("acme")
    ids = [_create(acme, jsonl(line("a"))).json()["id"] for _ in range(3)]
    first = acme.get("/v1/batches", limit="2").json()
    assert [b["id"] for b in first["data"]] == ids[::-1][:2]
    assert first["has_more"]
    rest = acme.get("/v1/batches", limit="2", after=first["last_id"]).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]]
    assert not rest["has_more"]


def test_an_expired_lease_is_claimed_again_and_the_old_owner_records_nothing(
    tenant: Tenant,
) -> None:
    _create(Signed("acme"), jsonl(line("a")))
    (first,) = lines_claim(owner="w1", limit=10, lease_s=60)
    assert lines_claim(owner="w2", limit=10, lease_s=60) == []  # leased
    BatchLine.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now() - timedelta(1))
    (again,) = lines_claim(owner="w2", limit=10, lease_s=60)
    assert (again.pk, again.attempts) == (first.pk, 2)
    assert not line_record(line_id=first.pk, owner="w1", status_code=200, body={},
                           request_id="r1")  # fmt: skip
    assert line_record(line_id=first.pk, owner="w2", status_code=200, body={}, request_id="r2")
    assert not line_record(line_id=first.pk, owner="w2", status_code=200, body={},
                           request_id="r3")  # fmt: skip
    batch = Batch.objects.get()
    assert (batch.completed, batch.failed) == (1, 0)


def test_cancel_reports_the_unfinished_lines_cancelled(tenant: Tenant) -> None:
    acme = Signed("acme")
    created = _create(acme, jsonl(line("a"), line("b"))).json()
    (running,) = lines_claim(owner="w1", limit=1, lease_s=60)
    resp = acme.post_json(f"/v1/batches/{created['id']}/cancel", {})
    assert resp.json()["status"] == "cancelling"
    assert lines_claim(owner="w2", limit=10, lease_s=60) == []  # nothing new starts
    assert batch_finalize(batch_id=running.batch_id) is None  # "a" still runs
    line_record(line_id=running.pk, owner="w1", status_code=200, body={"x": 1}, request_id="r")
    batch = batch_finalize(batch_id=running.batch_id)
    assert batch is not None
    assert batch.status == "cancelled"
    assert (batch.completed, batch.failed) == (1, 1)
    assert batch.error_file is not None
    (entry,) = [json.loads(x) for x in file_read(batch.error_file).splitlines()]
    assert (entry["custom_id"], entry["error"]["code"]) == ("b", "batch_cancelled")
    resp = acme.post_json(f"/v1/batches/{created['id']}/cancel", {})
    assert (resp.status_code, _error(resp)["code"]) == (409, "batch_not_cancellable")
    with pytest.raises(Exception, match="cancelled"):
        batch_cancel(batch=batch)


def test_expiry_reports_the_unfinished_lines_expired(tenant: Tenant) -> None:
    created = _create(Signed("acme"), jsonl(line("a")))
    batch = Batch.objects.get(public_id=created.json()["id"])
    batch = batch_finalize(batch_id=batch.pk, expired=True)
    assert batch is not None
    assert batch.status == "expired"
    assert batch.expired_at is not None
    assert batch.error_file is not None
    (entry,) = [json.loads(x) for x in file_read(batch.error_file).splitlines()]
    assert entry["error"]["code"] == "batch_expired"


def test_files_list_get_and_delete(tenant: Tenant) -> None:
    acme = Signed("acme")
    file = acme.upload(jsonl(line("a"))).json()
    assert (file["object"], file["purpose"], file["filename"]) == ("file", "batch", "input.jsonl")
    assert [f["id"] for f in acme.get("/v1/files").json()["data"]] == [file["id"]]
    assert acme.get(f"/v1/files/{file['id']}/content").content == jsonl(line("a"))
    assert acme.delete(f"/v1/files/{file['id']}").json()["deleted"] is True
    assert acme.get(f"/v1/files/{file['id']}").status_code == 404


def test_a_passing_failure_retries_later_then_fails_the_line(tenant: Tenant) -> None:
    _create(Signed("acme"), jsonl(line("a")))
    (claimed,) = lines_claim(owner="w1", limit=10, lease_s=60)
    executor._settle("w1", claimed, executor.Answer(429, {"error": {"code": "rate_limit"}}))
    assert BatchLine.objects.get().state == "pending"
    assert lines_claim(owner="w2", limit=10, lease_s=60) == []  # held back: 2 s
    BatchLine.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    (again,) = lines_claim(owner="w2", limit=10, lease_s=60)
    BatchLine.objects.update(attempts=executor.MAX_ATTEMPTS)
    again.attempts = executor.MAX_ATTEMPTS
    executor._settle("w2", again, executor.Answer(429, {"error": {"code": "rate_limit"}}))
    done = BatchLine.objects.get()
    assert (done.state, done.status_code) == ("failed", 429)
    batch = batch_finalize(batch_id=done.batch_id)
    assert batch is not None
    assert batch.error_file is not None
    (entry,) = [json.loads(x) for x in file_read(batch.error_file).splitlines()]
    assert (entry["response"]["status_code"], entry["error"]["code"]) == (429, "rate_limit")


def test_a_retry_after_a_5xx_or_a_claim_in_progress_sends_a_fresh_idempotency_key(
    tenant: Tenant,
) -> None:
    """A try the router answered 5xx is over: the retry does not wait on its claim."""
    _create(Signed("acme"), jsonl(line("a")))
    answers = [
        (429, "rate_limit", 0),  # refused before it ran: the same key
        (0, "router_unreachable", 0),  # no answer: the try may still run, the same key
        (500, "internal_error", 1),
        (409, "idempotency_key_in_progress", 2),
        (503, "no_healthy_endpoint", 3),
    ]
    for status, code, epoch in answers:
        BatchLine.objects.update(lease_expires_at=None)
        (claimed,) = lines_claim(owner="w1", limit=10, lease_s=60)
        executor._settle("w1", claimed, executor.Answer(status, {"error": {"code": code}}))
        again = BatchLine.objects.get()
        assert (again.state, again.idempotency_epoch) == ("pending", epoch), status
        suffix = f"-line-{again.number}" + (f"-e{epoch}" if epoch else "")
        assert executor.idempotency_key(again).endswith(suffix)


def test_a_batch_tick_still_queued_after_its_interval_expires() -> None:
    """Beat's batch entries expire after their interval: a worker slower than the schedule
    drops the stale ones instead of queueing them in front of every other periodic task."""
    schedule = django_settings.CELERY_BEAT_SCHEDULE
    for name in ("run-batches", "bill-batch-lines"):
        entry = schedule[name]
        assert entry["options"]["expires"] == max(5.0, 2 * entry["schedule"]), name


def _scrape() -> dict[str, float]:
    from django.test import Client  # noqa: PLC0415
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    text = Client().get("/metrics").content.decode()
    return {
        " ".join(
            [sample.name, *(sample.labels.get(k, "") for k in ("tenant", "model", "state"))]
        ).strip(): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("switchyard_batch")
    }


def test_metrics_count_running_lines_and_batches_at_risk(tenant: Tenant) -> None:
    _create(Signed("acme"), jsonl(line("a"), line("b"), line("c", model="nope")))
    lines_claim(owner="w1", limit=1, lease_s=60)
    assert _scrape() == {
        "switchyard_batch_lines acme batch-chat claimed": 1,
        "switchyard_batch_lines acme batch-chat pending": 1,
        "switchyard_batch_lines acme nope failed": 1,
        "switchyard_batches_at_risk": 0,
    }
    Batch.objects.update(expires_at=timezone.now() + timedelta(minutes=30))
    assert _scrape()["switchyard_batches_at_risk"] == 1


def test_lines_sharing_a_system_prompt_are_claimed_together(tenant: Tenant) -> None:
    def with_system(custom_id: str, system: str) -> bytes:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": custom_id}]
        body = {"model": "batch-chat", "messages": messages}
        item = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
        return json.dumps({**item, "body": body}).encode()

    prompts = {"a1": "A", "b1": "B", "a2": "A", "b2": "B", "a3": "A"}
    _create(Signed("acme"), jsonl(*(with_system(c, p) for c, p in prompts.items())))
    first = {line.custom_id for line in lines_claim(owner="w1", limit=2, lease_s=60)}
    second = {line.custom_id for line in lines_claim(owner="w1", limit=3, lease_s=60)}
    assert {frozenset(first), frozenset(second)} in (
        {frozenset({"a1", "a2"}), frozenset({"a3", "b1", "b2"})},
        {frozenset({"b1", "b2"}), frozenset({"a1", "a2", "a3"})},
    )


def test_out_of_credits_pauses_the_batch_with_the_reason_and_a_grant_resumes_it(
    tenant: Tenant,
) -> None:
    acme = Signed("acme")
    created = _create(acme, jsonl(line("a"), line("b"))).json()
    (claimed, _) = lines_claim(owner="w1", limit=2, lease_s=60)
    refusal = {"error": {"code": "insufficient_credits", "message": "Balance too low."}}
    executor._settle("w1", claimed, executor.Answer(402, refusal))
    view = acme.get(f"/v1/batches/{created['id']}").json()
    assert view["status"] == "in_progress"
    assert view["errors"]["data"][0]["code"] == "insufficient_credits"
    refused = BatchLine.objects.get(pk=claimed.pk)
    assert (refused.state, refused.attempts) == ("pending", 0)  # the try is not spent
    assert lines_claim(owner="w2", limit=10, lease_s=60) == []  # paused: nothing starts
    assert batches_resume_due() == 0

    credit_grant(actor=None, tenant=tenant, amount="10", reason="top-up")
    assert batches_resume_due() == 1
    assert acme.get(f"/v1/batches/{created['id']}").json()["errors"] is None
    assert [x.custom_id for x in lines_claim(owner="w2", limit=10, lease_s=60)] == ["a"]


def test_a_402_from_a_balance_redis_lost_reconciles_at_once_instead_of_pausing(
    tenant: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        credit_grant(actor=None, tenant=tenant, amount="10", reason="credits")  # ledger and Redis
    client = ledger.redis_client()
    key = credit_key(ledger.limits_prefix(), tenant.slug)
    client.delete(key)  # a Redis restart that kept nothing: the routers refuse 402
    created = _create(Signed("acme"), jsonl(line("a"), line("b"))).json()
    refusal = {"error": {"code": "insufficient_credits", "message": "Balance too low."}}
    restored: dict[int, bool] = {}  # one executor run: both lines were sent before the repair
    for claimed in lines_claim(owner="w1", limit=2, lease_s=60):
        executor._settle("w1", claimed, executor.Answer(402, refusal), None, restored)
    assert restored == {tenant.pk: True}
    assert int(client.hget(key, "balance") or 0) == 10_000_000  # seeded from the ledger
    batch = Batch.objects.get(public_id=created["id"])
    assert (batch.paused_at, batch.errors) == (None, None)  # not paused: the lines run again
    assert AuditEvent.objects.filter(action="credit.reconcile").count() == 1
    again = lines_claim(owner="w2", limit=10, lease_s=60)
    assert sorted((x.custom_id, x.attempts) for x in again) == [("a", 1), ("b", 1)]  # no try spent

    # A refusal the ledger agrees with (nothing to repair) pauses the batch as before.
    executor._settle("w2", again[0], executor.Answer(402, refusal), None, {})
    batch.refresh_from_db()
    assert batch.paused_at is not None
    assert AuditEvent.objects.filter(action="credit.reconcile").count() == 1


def test_a_paused_batch_probes_again_after_a_while(tenant: Tenant) -> None:
    _create(Signed("acme"), jsonl(line("a")))
    (claimed,) = lines_claim(owner="w1", limit=1, lease_s=60)
    executor._settle("w1", claimed, executor.Answer(402, {"error": {"code": "budget_exceeded"}}))
    assert batches_resume_due() == 0
    Batch.objects.update(paused_at=timezone.now() - timedelta(seconds=PROBE_AFTER_S + 1))
    assert batches_resume_due() == 1
    assert len(lines_claim(owner="w2", limit=1, lease_s=60)) == 1


def test_more_refusals(tenant: Tenant) -> None:
    acme = Signed("acme")
    resp = acme.client.post("/v1/files", {"purpose": "batch"},
                            headers=acme.headers("POST", "/v1/files"))  # fmt: skip
    assert (resp.status_code, _error(resp)["code"]) == (400, "missing_file")
    assert acme.get("/v1/batches", after="batch_nope").status_code == 404
    created = _create(acme, jsonl(line("a"))).json()
    (claimed,) = lines_claim(owner="w1", limit=1, lease_s=60)
    line_record(line_id=claimed.pk, owner="w1", status_code=200, body={}, request_id="r")
    finished = batch_finalize(batch_id=claimed.batch_id)
    assert finished is not None
    assert finished.output_file is not None
    resp = acme.post_json("/v1/batches", {"input_file_id": finished.output_file.public_id,
        "endpoint": "/v1/chat/completions", "completion_window": "24h"})  # fmt: skip
    assert (resp.status_code, _error(resp)["code"]) == (400, "invalid_input_file")
    Tenant.objects.filter(pk=tenant.pk).update(status="suspended")
    resp = acme.get(f"/v1/batches/{created['id']}")
    assert (resp.status_code, _error(resp)["code"]) == (401, "invalid_principal")


def test_the_claim_deals_lines_round_robin_across_tenants_then_batches(tenant: Tenant) -> None:
    make_tenant("small")
    acme, small = Signed("acme"), Signed("small")
    big_one = _create(acme, jsonl(*(line(f"a{i}") for i in range(20)))).json()["id"]
    big_two = _create(acme, jsonl(*(line(f"b{i}") for i in range(20)))).json()["id"]
    tiny = _create(small, jsonl(line("s0"), line("s1"))).json()["id"]

    def batches(claimed: list[BatchLine]) -> list[str]:
        return sorted(line.batch.public_id for line in claimed)

    # 4 lines: 2 to each tenant; acme's 2 split across its two batches (not oldest first).
    assert batches(lines_claim(owner="w1", limit=4, lease_s=60)) == sorted(
        [big_one, big_two, tiny, tiny]
    )
    # The small tenant has nothing left: acme gets the whole claim, still alternating.
    assert batches(lines_claim(owner="w1", limit=4, lease_s=60)) == sorted([big_one, big_two] * 2)


@pytest.mark.parametrize(
    ("runnable", "limit", "shares"),
    [
        ([(1, 10, 50_000), (2, 20, 10)], 4, {10: 2, 20: 2}),
        ([(1, 10, 50_000), (2, 20, 1)], 4, {10: 3, 20: 1}),
        ([(1, 10, 5), (1, 11, 5), (2, 20, 5)], 6, {10: 2, 11: 1, 20: 3}),
        ([(1, 10, 1), (1, 11, 5)], 4, {10: 1, 11: 3}),
        ([(1, 10, 2)], 8, {10: 2}),
        ([], 8, {}),
    ],
)
def test_fair_shares(
    runnable: list[tuple[int, int, int]], limit: int, shares: dict[int, int]
) -> None:
    assert fair_shares(runnable, limit) == shares
