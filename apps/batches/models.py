"""The Batch API's records: uploaded files, batches and each batch's lines (issue #32).

A line's state lives here, in PostgreSQL, so a killed Celery worker loses nothing: a line is
``pending`` until an executor claims it with a lease (``claimed``, ``lease_owner``,
``lease_expires_at``), then ``done`` (its answer in ``response``) or ``failed`` (its error in
``error``). A claimed line whose lease has expired is claimed again.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from apps.tenants.models import Tenant


class File(models.Model):
    """A JSONL file: a batch's input (purpose ``batch``) or what it wrote (``batch_output``)."""

    class Purpose(models.TextChoices):
        BATCH = "batch", "Batch input"
        BATCH_OUTPUT = "batch_output", "Batch output"

    public_id = models.CharField(max_length=40, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="batch_files")
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField()
    lines = models.PositiveIntegerField()
    storage_name = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    # Zero retention (apps/batches/services/retention.py): when the bytes go unread at the
    # latest (a batch output of a zero_retention tenant), and when they were deleted (the row
    # stays, so the batch still names its files; the content is gone).
    expires_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["-id"]

    def __str__(self) -> str:
        return self.public_id


class Batch(models.Model):
    """A batch, with OpenAI's statuses and request counts."""

    class Status(models.TextChoices):
        VALIDATING = "validating", "Validating"
        FAILED = "failed", "Failed"
        IN_PROGRESS = "in_progress", "In progress"
        FINALIZING = "finalizing", "Finalizing"
        COMPLETED = "completed", "Completed"
        EXPIRED = "expired", "Expired"
        CANCELLING = "cancelling", "Cancelling"
        CANCELLED = "cancelled", "Cancelled"

    public_id = models.CharField(max_length=40, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="batches")
    input_file = models.ForeignKey(File, null=True, on_delete=models.SET_NULL, related_name="+")
    endpoint = models.CharField(max_length=40)
    completion_window = models.CharField(max_length=8, default="24h")
    metadata = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    errors = models.JSONField(null=True, blank=True)  # validation errors of a failed batch
    output_file = models.ForeignKey(File, null=True, on_delete=models.SET_NULL, related_name="+")
    error_file = models.ForeignKey(File, null=True, on_delete=models.SET_NULL, related_name="+")
    # Paused (no line starts) while the router answers 402: the reason, since when, and the
    # tenant's ledger balance then (a grant above it resumes the batch).
    paused_reason = models.CharField(max_length=300, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_balance = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    # The executor's credentials: a tenant API key minted for this batch (sealed), revoked
    # when the batch ends.
    exec_key_prefix = models.CharField(max_length=16, blank=True)
    exec_key_sealed = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    in_progress_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["-id"]
        indexes: ClassVar[list[models.Index]] = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return self.public_id


class BatchLine(models.Model):
    """One request of a batch, and what became of it (exactly one answer per line)."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        CLAIMED = "claimed", "Claimed"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    number = models.PositiveIntegerField()  # 1-based line number in the input file
    custom_id = models.CharField(max_length=512)
    body = models.JSONField()
    # Lines sharing a prompt prefix (the leading system messages, a prompt's head) run
    # together, so the engine's prefix cache serves them: claims are ordered by it.
    prefix_key = models.CharField(max_length=16, blank=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    lease_owner = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)  # the X-Request-Id sent
    # The usage event id every try of the line is billed under (the ledger's unique
    # ``UsageRecord.event_id``), recorded with the answer: the line's charge in the ledger.
    usage_event_id = models.CharField(max_length=64, blank=True)
    # Bumped when the router answers 409 ``idempotency_key_in_progress`` (a router killed while
    # it ran the line left its claim in Redis): the next try sends a fresh Idempotency-Key.
    idempotency_epoch = models.PositiveSmallIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["batch_id", "number"]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(fields=["batch", "number"], name="batchline_unique_number"),
            models.UniqueConstraint(fields=["batch", "custom_id"], name="batchline_unique_custom"),
        ]
        indexes: ClassVar[list[models.Index]] = [models.Index(fields=["batch", "state"])]

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.number}"
