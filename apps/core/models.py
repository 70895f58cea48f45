"""Platform-core data: the snapshot outbox."""

from __future__ import annotations

from django.db import models


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
        ordering = ("id",)
        verbose_name = "snapshot outbox entry"
        verbose_name_plural = "snapshot outbox"

    def __str__(self) -> str:
        return f"outbox #{self.pk} ({self.reason or 'change'}, {self.attempts} attempts)"
