"""Batches: creation (the input checked up front), cancellation, expiry."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.batches import exec_keys
from apps.batches.errors import BatchApiError, not_found
from apps.batches.models import Batch, BatchLine, File
from apps.batches.services.files import ENDPOINTS, file_read, new_id, parse_line, split_lines
from apps.models.models import Model
from apps.tenants.models import Tenant

WINDOWS = {"24h": timedelta(hours=24)}
MAX_METADATA_PAIRS = 16
_TASKS = {
    "/v1/chat/completions": ("chat", "completion"),
    "/v1/completions": ("chat", "completion"),
    "/v1/embeddings": ("embedding",),
}


def _check_request(
    body: dict[str, Any], *, tenant: Tenant, endpoint: str, models: dict[str, str]
) -> tuple[str, str] | None:
    """Why this line cannot run (code, message), or None: it goes to the error file."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "missing_model", "The request names no 'model'."
    task = models.get(model)
    if task is None:
        return "model_not_found", f"The model '{model}' does not exist."
    allowed = {m.name for m in tenant.allowed_models.all()}
    if allowed and model not in allowed:
        return "model_not_allowed", f"Your tenant is not allowed to use the model '{model}'."
    if task not in _TASKS[endpoint]:
        return "unsupported_model_task", f"The model '{model}' is a {task} model; not {endpoint}."
    for field in ("max_tokens", "max_completion_tokens"):
        asked = body.get(field)
        if isinstance(asked, int) and asked > tenant.max_output_tokens:
            return "max_tokens_exceeded", (
                f"{field} asks for {asked} output tokens, above this tenant's limit of "
                f"{tenant.max_output_tokens}."
            )
    return None


PREFIX_HEAD_CHARS = 512


def prefix_key(body: dict[str, Any]) -> str:
    """What a line's prompt starts with, hashed: its leading system / developer messages (else
    its first message), or the head of a completion prompt; "" when neither."""
    messages = body.get("messages")
    head: object = None
    if isinstance(messages, list) and messages:
        leading = []
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
                break
            leading.append(message)
        head = leading or messages[:1]
    elif isinstance(body.get("prompt"), str):
        head = body["prompt"][:PREFIX_HEAD_CHARS]
    if head is None:
        return ""
    raw = json.dumps(head, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def _check_metadata(metadata: object) -> dict[str, str] | None:
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA_PAIRS
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise BatchApiError(
            400, "invalid_metadata",
            f"'metadata' must map at most {MAX_METADATA_PAIRS} strings to strings.",
            param="metadata",
        )  # fmt: skip
    return metadata


def batch_create(
    *,
    tenant: Tenant,
    input_file_id: object,
    endpoint: object,
    completion_window: object,
    metadata: object = None,
) -> Batch:
    """A batch of the tenant's file. A malformed file (a line that is not a request, a line
    for another endpoint, a repeated ``custom_id``) is refused with its line number before any
    line runs; a well-formed line that cannot run (unknown model, over the tenant's caps) is
    reported in the error file and the others run."""
    if endpoint not in ENDPOINTS:
        raise BatchApiError(
            400, "invalid_endpoint", f"'endpoint' must be one of {', '.join(ENDPOINTS)}.",
            param="endpoint",
        )  # fmt: skip
    assert isinstance(endpoint, str)
    if completion_window not in WINDOWS:
        raise BatchApiError(
            400, "invalid_completion_window", "'completion_window' must be '24h'.",
            param="completion_window",
        )  # fmt: skip
    assert isinstance(completion_window, str)
    checked_metadata = _check_metadata(metadata)
    if not isinstance(input_file_id, str):
        raise BatchApiError(400, "invalid_input_file", "'input_file_id' is required.",
                            param="input_file_id")  # fmt: skip
    file = File.objects.filter(tenant=tenant, public_id=input_file_id).first()
    if file is None:
        raise not_found("file", input_file_id)
    if file.purpose != File.Purpose.BATCH:
        raise BatchApiError(400, "invalid_input_file", "The file's purpose is not 'batch'.",
                            param="input_file_id")  # fmt: skip
    models = dict(Model.objects.values_list("name", "task"))
    seen: set[str] = set()
    lines: list[BatchLine] = []
    for number, raw in split_lines(file_read(file)):
        item = parse_line(raw, number)
        if item["url"] != endpoint:
            raise BatchApiError(
                400, "mismatched_endpoint",
                f"Line {number}: 'url' is {item['url']}, the batch's endpoint is {endpoint}.",
                line=number,
            )  # fmt: skip
        if item["custom_id"] in seen:
            raise BatchApiError(
                400, "duplicate_custom_id",
                f"Line {number}: the custom_id '{item['custom_id']}' is already used.",
                line=number,
            )  # fmt: skip
        seen.add(item["custom_id"])
        line = BatchLine(
            number=number, custom_id=item["custom_id"], body=item["body"],
            prefix_key=prefix_key(item["body"]),
        )  # fmt: skip
        problem = _check_request(item["body"], tenant=tenant, endpoint=endpoint, models=models)
        if problem is not None:
            line.state = BatchLine.State.FAILED
            line.error = {"code": problem[0], "message": problem[1], "line": number}
            line.finished_at = timezone.now()
        lines.append(line)
    now = timezone.now()
    expires_at = now + WINDOWS[completion_window]
    with transaction.atomic():
        public_id = new_id("batch_")
        prefix, sealed = exec_keys.mint(tenant, public_id, expires_at)
        batch = Batch.objects.create(
            public_id=public_id, tenant=tenant, input_file=file, endpoint=endpoint,
            completion_window=completion_window, metadata=checked_metadata,
            status=Batch.Status.IN_PROGRESS, total=len(lines),
            failed=sum(1 for line in lines if line.state == BatchLine.State.FAILED),
            in_progress_at=now, expires_at=expires_at,
            exec_key_prefix=prefix, exec_key_sealed=sealed,
        )  # fmt: skip
        for line in lines:
            line.batch = batch
        BatchLine.objects.bulk_create(lines, batch_size=1000)
    return batch


def batch_cancel(*, batch: Batch) -> Batch:
    """Stop a batch: no further line starts; lines running finish; the executor's next tick
    finalizes it ``cancelled`` (its unfinished lines reported cancelled)."""
    with transaction.atomic():
        locked = Batch.objects.select_for_update().get(pk=batch.pk)
        if locked.status not in (Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS):
            raise BatchApiError(
                409, "batch_not_cancellable",
                f"The batch is {locked.status}; only a running batch can be cancelled.",
            )  # fmt: skip
        locked.status = Batch.Status.CANCELLING
        locked.cancelling_at = timezone.now()
        locked.save(update_fields=["status", "cancelling_at"])
    return locked


def batch_expire_due() -> list[Batch]:
    """The running batches past their completion window (the tick finalizes them expired)."""
    return list(
        Batch.objects.filter(
            status__in=(Batch.Status.IN_PROGRESS, Batch.Status.CANCELLING),
            expires_at__lte=timezone.now(),
        )
    )
