"""The base app's data: the append-only audit log and the snapshot outbox.

Both tables keep the names they had in their first apps (``tenants_auditevent``,
``core_snapshotoutbox``): the models moved here by state-only migrations, no data moved.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.db import models

from apps.common.retention_policy import Retention


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise PermissionError("audit events are append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class AuditEvent(models.Model):
    """Append-only record of a control-plane change (also enforced by a database trigger)."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    actor_label = models.CharField(
        max_length=150, help_text="Who, as text: a username or 'system'."
    )
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=100)
    target_id = models.CharField(max_length=64)
    target_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()
    # Archived before deletion (apps/common/retention.py; the trigger checks it, 0002).
    retention: ClassVar[Retention] = Retention("audit", "created_at", archive=True)

    class Meta:
        db_table = "tenants_auditevent"
        ordering: ClassVar[list[str]] = ["-created_at", "-id"]

    def __str__(self) -> str:
        when = f"{self.created_at:%Y-%m-%d %H:%M:%S}"
        return f"{when} {self.actor_label} {self.action} {self.target_repr}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise PermissionError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class SnapshotOutbox(models.Model):
    """A committed change the data plane has not been sent yet.

    Written in the same transaction as the change (``snapshot_publish_on_commit``), deleted
    once a snapshot built after that commit is in Redis. A row that outlives its first publish
    attempt (Redis down, publish failed) is retried by the beat task ``snapshot_outbox_drain``
    until it lands, so a revocation or suspension is never left to a log line.
    """

    created_at = models.DateTimeField(auto_now_add=True)
    reason = models.CharField(max_length=200, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "core_snapshotoutbox"
        ordering = ("id",)
        verbose_name = "snapshot outbox entry"
        verbose_name_plural = "snapshot outbox"

    def __str__(self) -> str:
        return f"outbox #{self.pk} ({self.reason or 'change'}, {self.attempts} attempts)"
