"""The executor: one tick claims lines, sends them to the router, records the answers.

Each line goes to the ROUTER's public endpoint (``BATCH_ROUTER_URL`` + the batch's endpoint),
with the batch's own API key (:mod:`apps.batches.exec_keys`) and the ``batch`` request class
when the tenant has it (the lowest band: the router's fairness and dispatch give it what the
interactive classes leave), so a line is admitted, limited, metered and billed like any
request. ``X-Request-Id`` is ``batch-<line id>-<attempt>``: the router's request log and usage
event carry it.

**Exactly once, billed once** (issue #32, item 4). The guarantee lives in PostgreSQL, not in
the router's Redis records:

- *Answered once*: a line's state is its row (``pending`` -> ``claimed`` under a renewable
  lease -> ``done``/``failed`` with its answer); the answer is recorded only by the holder of
  a live lease, in the transaction that counts it (:mod:`apps.batches.services.lines`), and
  the output file is written from the rows. A worker or router killed mid-line leaves the
  line ``claimed``; its lease expires and another tick runs it again.
- *Billed once*: each request carries ``X-Switchyard-Batch-Line``, the line's reference
  signed with ``SWITCHYARD_INTERNAL_SECRET`` (:func:`runtime.internal_principal.sign_line`).
  The router bills a marked request under the usage event id ``batch-line-<line id>``, the
  same for every try of the line, and the ledger's ``UsageRecord.event_id`` is unique: however
  many tries reached an engine (a retry after a worker kill, after a router killed after its
  settlement, after a Redis restart lost the idempotency records), the ledger debits the line
  once. The line's row keeps that id (``usage_event_id``) beside its answer. (A second try's
  charge to the Redis balance, which the ledger skips, is the drift
  :func:`apps.billing.ledger.credit_reconcile` repairs.) Embeddings lines, which the router's
  idempotency skips, are covered the same way. The line also keeps what its answer used
  (``usage``: version, class, tokens): if the event itself is lost (Redis lost the usage
  stream's unread tail), :mod:`apps.batches.services.unbilled` charges the line from it,
  under the same event id, so a late stream record and the repair still make one charge.
- ``Idempotency-Key`` is the line's (the same on every try) and only saves work: a retry after
  its worker died gets the router's stored answer of the first try, unbilled, while the router
  still holds it (Redis, 24 h). A router killed mid-line leaves its claim on the key for 24 h;
  the retry's 409 ``idempotency_key_in_progress`` bumps the line's ``idempotency_epoch``, and
  the next try sends a fresh key. So does a try the router answered 5xx (it is over; a router
  whose Redis timed out may not have forgotten its claim, which would hold the retry for the
  class deadline).

The mark also admits the line in the tenant's *batch lane* (``SWITCHYARD_BATCH_CONCURRENCY``
on the router), not under its online RPM/TPM/concurrency caps. Without an internal secret no
mark is sent: lines run under the online caps and a retried line may be billed per try.

Lines run concurrently (one thread each, up to ``BATCH_CLAIM_SIZE``); the
database writes stay on the calling thread; leases are renewed while requests run.

A line whose request could not be answered for a passing reason (the router unreachable, 429,
5xx, 401 while the router has not yet loaded the batch's key) goes back to ``pending`` and runs
again after 2, 4, 8, ... seconds (at most :data:`RETRY_CAP_S`), up to :data:`MAX_ATTEMPTS`
tries; then it fails with that status. A 402 (credits or budget) pauses the batch instead
(:mod:`apps.batches.services.pause`), unless it came from a balance Redis lost: then the
balances are reconciled with the ledger at once and the line runs again.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q

from apps.batches import exec_keys
from apps.batches.models import Batch, BatchLine
from apps.batches.services import (
    batch_expire_due,
    batch_finalize,
    files_expire,
    files_retention_apply,
    line_record,
    lines_claim,
)
from apps.batches.services.lines import line_release, lines_renew
from apps.batches.services.pause import balance_restored, batch_pause, batches_resume_due
from runtime.internal_principal import LINE_HEADER, line_event_id, sign_line

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
RETRY_CAP_S = 60.0  # a released line waits 2, 4, 8, ... seconds (at most this) before its next try
RETRYABLE = frozenset({0, 401, 408, 409, 429, 500, 502, 503, 504})
PAYMENT_REQUIRED = 402
REQUEST_TIMEOUT_S = 600.0
TICK_BUDGET_S = 20.0  # a tick claims again while it has lines and this much time


@dataclass(frozen=True, slots=True)
class Answer:
    status: int  # 0: no HTTP answer
    body: Any
    served: dict[str, str] = field(default_factory=dict)  # the router's x-switchyard-* headers


_SERVED_HEADERS = ("x-switchyard-version", "x-switchyard-model", "x-switchyard-cache")


def send(url: str, key: str, line: BatchLine, request_class: str | None) -> Answer:
    body = dict(line.body)
    body.pop("stream", None)  # a batch line is answered whole
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "X-Request-Id": f"batch-{line.pk}-{line.attempts}",
        # The same on every try of the line (until a stuck claim bumps the epoch): a retry
        # after a crash gets the router's stored answer of the first try (served unbilled).
        "Idempotency-Key": idempotency_key(line),
    }
    secret = settings.INTERNAL_SECRET
    if secret:  # the batch lane, and one ledger charge for every try (see the module)
        headers[LINE_HEADER] = sign_line(secret, tenant=line.batch.tenant.slug,
                                         ref=str(line.pk), now=time.time())  # fmt: skip
    if request_class:
        headers["X-Switchyard-Class"] = request_class
    request = urllib.request.Request(  # noqa: S310 - the configured router's URL
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as resp:  # noqa: S310
            served = {h: resp.headers[h] for h in _SERVED_HEADERS if resp.headers.get(h)}
            return Answer(resp.status, _decode(resp.read()), served)
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, _decode(exc.read()))
    except (OSError, TimeoutError) as exc:
        return Answer(0, {"error": {"code": "router_unreachable", "message": str(exc)}})


def idempotency_key(line: BatchLine) -> str:
    key = f"{line.batch.public_id}-line-{line.number}"
    return f"{key}-e{line.idempotency_epoch}" if line.idempotency_epoch else key


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"raw": raw.decode("utf-8", "replace")[:2000]}


def _request_class(batch: Batch) -> str | None:
    wanted = settings.BATCH_CLASS
    if wanted and batch.tenant.allowed_classes.filter(name=wanted).exists():
        return str(wanted)
    return None


def run_lines(owner: str, lines: list[BatchLine]) -> set[int]:
    """Send every claimed line, record each answer as it comes; the batches touched."""
    keys: dict[int, str] = {}
    classes: dict[int, str | None] = {}
    for line in lines:
        if line.batch_id not in keys:
            keys[line.batch_id] = exec_keys.unseal(line.batch)
            classes[line.batch_id] = _request_class(line.batch)
    lease_s = settings.BATCH_LEASE_S
    base = settings.BATCH_ROUTER_URL.rstrip("/")
    restored: dict[int, bool] = {}  # per tenant: this run's 402s came from a lost balance
    with ThreadPoolExecutor(max_workers=max(1, len(lines))) as pool:
        running: dict[Future[Answer], BatchLine] = {
            pool.submit(
                send, base + line.batch.endpoint, keys[line.batch_id], line,
                classes[line.batch_id],
            ): line
            for line in lines
        }  # fmt: skip
        while running:
            finished, _ = wait(running, timeout=lease_s / 3, return_when=FIRST_COMPLETED)
            if not finished:
                ids = [line.pk for line in running.values()]
                lines_renew(owner=owner, ids=ids, lease_s=lease_s)
                continue
            for future in finished:
                line = running.pop(future)
                _settle(owner, line, future.result(), classes[line.batch_id], restored)
    return {line.batch_id for line in lines}


def _settle(
    owner: str, line: BatchLine, answer: Answer, request_class: str | None = None,
    restored: dict[int, bool] | None = None,
) -> None:  # fmt: skip
    if answer.status == PAYMENT_REQUIRED:  # out of credits or budget: pause, keep the try
        detail = answer.body.get("error", {}) if isinstance(answer.body, dict) else {}
        code = str(detail.get("code") or "insufficient_credits")
        # A balance Redis lost is restored at once (one reconciliation per tenant and run: the
        # run's lines were all sent before it); the line runs again, the batch goes on.
        memo = {} if restored is None else restored
        tenant = line.batch.tenant
        if tenant.pk not in memo:
            memo[tenant.pk] = balance_restored(tenant=tenant, code=code)
        if not memo[tenant.pk]:
            batch_pause(batch_id=line.batch_id, code=code,
                        message=str(detail.get("message") or "HTTP 402"))  # fmt: skip
        line_release(line_id=line.pk, owner=owner, retry_in_s=0, spend_try=False)
        return
    if answer.status in RETRYABLE and line.attempts < MAX_ATTEMPTS:
        logger.info("batch line %s: HTTP %s, retried later", line.pk, answer.status)
        retry_in_s = min(RETRY_CAP_S, 2.0**line.attempts)
        # A fresh key after a claim still held (409), and after any try the router answered
        # 5xx: that try is over, and its claim would be forgotten, unless the router could not
        # reach Redis to forget it; then the retry would wait out its class deadline on it.
        stuck = _code(answer) == "idempotency_key_in_progress" or answer.status >= 500
        line_release(line_id=line.pk, owner=owner, retry_in_s=retry_in_s,
                     new_idempotency_key=stuck)  # fmt: skip
        return
    request_id = f"batch-{line.pk}-{line.attempts}"
    if not line_record(line_id=line.pk, owner=owner, status_code=answer.status or 502,
                       body=answer.body, request_id=request_id,
                       usage_event_id=line_event_id(str(line.pk)),
                       usage=answer_usage(line, answer, request_class)):  # fmt: skip
        logger.warning("batch line %s: lease lost before its answer was recorded", line.pk)


def answer_usage(
    line: BatchLine, answer: Answer, request_class: str | None
) -> dict[str, Any] | None:
    """What a 2xx answer used, as the router bills it (the version that served it, its class,
    its tokens): kept with the line, so a charge the usage stream lost can be made again
    (:mod:`apps.batches.services.unbilled`). None for an answer without ``usage``."""
    usage = answer.body.get("usage") if isinstance(answer.body, dict) else None
    if not 200 <= answer.status < 300 or not isinstance(usage, dict):
        return None
    tokens_in = int(usage.get("prompt_tokens") or 0)
    total = int(usage.get("total_tokens") or 0)
    tokens_out = int(usage.get("completion_tokens") or max(0, total - tokens_in))
    return {
        "model": answer.served.get("x-switchyard-model") or str(line.body.get("model", "")),
        "version": answer.served.get("x-switchyard-version", ""),
        "request_class": request_class or "default",
        "tokens_in": tokens_in, "tokens_out": tokens_out,
        "cached": answer.served.get("x-switchyard-cache", "").lower() == "hit",
    }  # fmt: skip


def _code(answer: Answer) -> str:
    error = answer.body.get("error") if isinstance(answer.body, dict) else None
    return str(error.get("code") or "") if isinstance(error, dict) else ""


def finalize_ready(batch_ids: set[int] | None = None) -> int:
    """End the batches that can end (all lines answered, or cancelled); how many ended."""
    for batch in batch_expire_due():
        batch_finalize(batch_id=batch.pk, expired=True)
    open_lines = Q(lines__state__in=(BatchLine.State.PENDING, BatchLine.State.CLAIMED))
    candidates = Batch.objects.filter(status=Batch.Status.CANCELLING) | Batch.objects.filter(
        status=Batch.Status.IN_PROGRESS
    ).exclude(open_lines)
    if batch_ids is not None:
        candidates = candidates.filter(pk__in=batch_ids)
    ended = 0
    for pk in set(candidates.values_list("pk", flat=True)):
        if batch_finalize(batch_id=pk) is not None:
            ended += 1
    return ended


def tick(owner: str) -> dict[str, int]:
    """One beat tick: finalize what can end, then run lines while there are some (bounded);
    last, purge the zero_retention outputs left unread past their window and the files past
    their tenant's retention period."""
    started = time.monotonic()
    batches_resume_due()
    ended = finalize_ready()
    ran = 0
    while time.monotonic() - started < TICK_BUDGET_S:
        lines = lines_claim(owner=owner, limit=settings.BATCH_CLAIM_SIZE,
                            lease_s=settings.BATCH_LEASE_S)  # fmt: skip
        if not lines:
            break
        touched = run_lines(owner, lines)
        ran += len(lines)
        ended += finalize_ready(touched)
    return {"lines": ran, "batches_ended": ended, "files_expired": files_expire(),
            "files_retention_purged": files_retention_apply()}  # fmt: skip
