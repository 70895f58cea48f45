"""The executor's side: claim lines with a lease, record each answer once, finalize.

Exactly once in the output: a line moves ``claimed -> done|failed`` only while the recorder
still holds its lease (row locked, owner checked), in the same transaction that counts it in
the batch; the output and error files are written from the rows, one entry per line. A worker
killed mid-line leaves the line ``claimed``; once its lease expires another tick claims it
again (``attempts`` counts the tries).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from apps.batches import exec_keys
from apps.batches.models import Batch, BatchLine, File
from apps.batches.services.files import store
from apps.batches.services.retention import batch_forget

_ENDED = {
    Batch.Status.CANCELLING: (Batch.Status.CANCELLED, "cancelled_at", "batch_cancelled",
                              "The batch was cancelled before this request ran."),
    Batch.Status.IN_PROGRESS: (Batch.Status.EXPIRED, "expired_at", "batch_expired",
                               "The batch expired before this request ran."),
}  # fmt: skip


def lines_claim(*, owner: str, limit: int, lease_s: float) -> list[BatchLine]:
    """Up to ``limit`` lines of running batches, pending or with an expired lease, claimed for
    ``owner`` (``SELECT ... FOR UPDATE SKIP LOCKED``: concurrent claimers never share one).

    Fair share: the claim is dealt round-robin, one line at a time, across the tenants with
    runnable lines, and within a tenant across its batches (oldest first), so one tenant's
    50,000-line batch never starves another's 10 lines (:func:`fair_shares`). Within a batch,
    lines sharing a prompt prefix go together."""
    now = timezone.now()
    # Pending (not held back by a retry delay), or claimed with an expired lease.
    runnable = (
        Q(state__in=(BatchLine.State.PENDING, BatchLine.State.CLAIMED))
        & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        & Q(batch__status=Batch.Status.IN_PROGRESS, batch__expires_at__gt=now,
            batch__paused_at__isnull=True)
    )  # fmt: skip
    counts = (
        BatchLine.objects.filter(runnable)
        .values_list("batch__tenant_id", "batch_id")
        .annotate(n=Count("id"))
        .order_by("batch__tenant_id", "batch_id")
    )
    shares = fair_shares([(tenant, batch, n) for tenant, batch, n in counts], limit)
    if not shares:
        return []
    with transaction.atomic():
        lines: list[BatchLine] = []
        for batch_id, share in shares.items():
            lines += list(
                BatchLine.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(runnable, batch_id=batch_id)
                .order_by("prefix_key", "number")[:share]
            )
        if not lines:
            return []
        BatchLine.objects.filter(pk__in=[line.pk for line in lines]).update(
            state=BatchLine.State.CLAIMED,
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_s),
            attempts=F("attempts") + 1,
        )
    claimed = BatchLine.objects.filter(pk__in=[line.pk for line in lines], lease_owner=owner)
    return list(claimed.select_related("batch", "batch__tenant"))


def fair_shares(runnable: list[tuple[int, int, int]], limit: int) -> dict[int, int]:
    """How many lines of each batch a claim of ``limit`` takes: ``runnable`` is (tenant,
    batch, runnable lines) sorted by tenant then batch; the lines are dealt one at a time to
    each tenant in turn, and within a tenant to each of its batches in turn."""
    by_tenant: dict[int, list[list[int]]] = {}
    for tenant, batch_id, n in runnable:
        by_tenant.setdefault(tenant, []).append([batch_id, n])
    turn = dict.fromkeys(by_tenant, 0)  # the next batch of each tenant
    shares: dict[int, int] = {}
    left = limit
    while left > 0 and by_tenant:
        for tenant in list(by_tenant):
            if left == 0:
                break
            batches = by_tenant[tenant]
            i = turn[tenant] % len(batches)
            batch = batches[i]
            shares[batch[0]] = shares.get(batch[0], 0) + 1
            left -= 1
            batch[1] -= 1
            if batch[1] == 0:
                batches.pop(i)
                if not batches:
                    del by_tenant[tenant]
                    continue
                turn[tenant] = i  # the batch after it is at i now
            else:
                turn[tenant] = i + 1
    return shares


def lines_renew(*, owner: str, ids: list[int], lease_s: float) -> int:
    """Extend the lease of the lines ``owner`` still holds; how many."""
    return BatchLine.objects.filter(
        pk__in=ids, state=BatchLine.State.CLAIMED, lease_owner=owner
    ).update(lease_expires_at=timezone.now() + timedelta(seconds=lease_s))


def line_record(
    *,
    line_id: int,
    owner: str,
    status_code: int,
    body: Any,
    request_id: str,
    usage_event_id: str = "",
) -> bool:
    """Record the answer of a line ``owner`` holds: done (2xx) or failed, counted in the
    batch, in one transaction, with the usage event id the line is billed under (every try's).
    False (nothing written) when the lease was lost meanwhile."""
    ok = 200 <= status_code < 300
    with transaction.atomic():
        line = (
            BatchLine.objects.select_for_update()
            .filter(pk=line_id, state=BatchLine.State.CLAIMED, lease_owner=owner)
            .first()
        )
        if line is None:
            return False
        line.state = BatchLine.State.DONE if ok else BatchLine.State.FAILED
        line.status_code = status_code
        line.response = body
        line.request_id = request_id
        line.usage_event_id = usage_event_id
        line.lease_owner = ""
        line.lease_expires_at = None
        line.finished_at = timezone.now()
        line.save()
        counter = "completed" if ok else "failed"
        Batch.objects.filter(pk=line.batch_id).update(**{counter: F(counter) + 1})
    return True


def line_release(
    *, line_id: int, owner: str, retry_in_s: float, spend_try: bool = True,
    new_idempotency_key: bool = False,
) -> None:  # fmt: skip
    """Give a claimed line back (a passing failure: the router unreachable, a 429, ...):
    pending again, claimable once ``retry_in_s`` has passed. ``spend_try=False``: the try
    does not count (a 402 pauses the batch instead). ``new_idempotency_key``: the next try
    sends a fresh key (the router holds a dead try's claim on this one)."""
    BatchLine.objects.filter(pk=line_id, state=BatchLine.State.CLAIMED, lease_owner=owner).update(
        state=BatchLine.State.PENDING,
        lease_owner="",
        lease_expires_at=timezone.now() + timedelta(seconds=retry_in_s),
        attempts=F("attempts") - (0 if spend_try else 1),
        idempotency_epoch=F("idempotency_epoch") + (1 if new_idempotency_key else 0),
    )


def _output_entry(line: BatchLine) -> dict[str, Any]:
    return {
        "id": f"batch_req_{line.pk}",
        "custom_id": line.custom_id,
        "response": {"status_code": line.status_code, "request_id": line.request_id,
                     "body": line.response},
        "error": None,
    }  # fmt: skip


def _error_entry(line: BatchLine, fallback: tuple[str, str] | None) -> dict[str, Any]:
    response = None
    error = line.error
    if line.status_code is not None:  # the router answered, not with a 2xx
        response = {"status_code": line.status_code, "request_id": line.request_id,
                    "body": line.response}  # fmt: skip
        detail = (line.response or {}).get("error", {}) if isinstance(line.response, dict) else {}
        error = {"code": detail.get("code"), "message": detail.get("message")}
    elif error is None and fallback is not None:
        error = {"code": fallback[0], "message": fallback[1]}
    return {"id": f"batch_req_{line.pk}", "custom_id": line.custom_id, "response": response,
            "error": error}  # fmt: skip


def _jsonl(entries: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(entry).encode() + b"\n" for entry in entries)


def batch_finalize(*, batch_id: int, expired: bool = False) -> Batch | None:
    """End a batch whose lines are all answered (``completed``), that was cancelled, or whose
    window passed (``expired``): write the output and error files, one entry per line in
    input order, revoke the executor's key, and (zero retention) drop the input and the
    lines' contents. None when it is not ready to end (a line is
    still running under a live lease, or another tick finalizes it)."""
    now = timezone.now()
    with transaction.atomic():
        batch = (
            Batch.objects.select_for_update(skip_locked=True)
            .select_related("tenant")
            .filter(pk=batch_id, status__in=(Batch.Status.IN_PROGRESS, Batch.Status.CANCELLING))
            .first()
        )
        if batch is None:
            return None
        # Locked: a recorder still holding a line waits, then finds it ended (records nothing).
        lines = list(batch.lines.select_for_update().order_by("number"))
        open_states = (BatchLine.State.PENDING, BatchLine.State.CLAIMED)
        unfinished = [line for line in lines if line.state in open_states]
        live = [
            line for line in unfinished
            if line.state == BatchLine.State.CLAIMED and line.lease_expires_at
            and line.lease_expires_at > now
        ]  # fmt: skip
        ending = None
        if expired:
            ending = _ENDED[Batch.Status.IN_PROGRESS]
        elif batch.status == Batch.Status.CANCELLING:
            if live:
                return None  # lines still running: they finish first
            ending = _ENDED[Batch.Status.CANCELLING]
        elif unfinished:
            return None
        done = [_output_entry(line) for line in lines if line.state == BatchLine.State.DONE]
        fallback = (ending[2], ending[3]) if ending else None
        errors = [
            _error_entry(line, fallback) for line in lines if line.state != BatchLine.State.DONE
        ]
        batch.finalizing_at = now
        if done:
            batch.output_file = store(
                tenant=batch.tenant, purpose=File.Purpose.BATCH_OUTPUT,
                filename=f"{batch.public_id}_output.jsonl", content=_jsonl(done), lines=len(done),
            )  # fmt: skip
        if errors:
            batch.error_file = store(
                tenant=batch.tenant, purpose=File.Purpose.BATCH_OUTPUT,
                filename=f"{batch.public_id}_error.jsonl", content=_jsonl(errors),
                lines=len(errors),
            )  # fmt: skip
        if ending is None:
            batch.status, batch.completed_at = Batch.Status.COMPLETED, now
        else:
            batch.status = ending[0]
            setattr(batch, ending[1], now)
        if unfinished:
            BatchLine.objects.filter(pk__in=[line.pk for line in unfinished]).update(
                state=BatchLine.State.FAILED, lease_owner="", lease_expires_at=None,
                error={"code": fallback[0], "message": fallback[1]} if fallback else None,
                finished_at=now,
            )  # fmt: skip
        batch.failed = len(errors)
        batch.completed = len(done)
        batch.save()
        exec_keys.revoke(batch)
        batch_forget(batch)  # a zero_retention tenant's files and line contents
    return batch
