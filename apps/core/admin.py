"""Admin for the platform core: the snapshot outbox, read-only (the drain task owns it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest

from apps.core.models import SnapshotOutbox

if TYPE_CHECKING:  # generic in django-stubs only; not subscriptable at runtime
    _OutboxAdmin = admin.ModelAdmin[SnapshotOutbox]
else:
    _OutboxAdmin = admin.ModelAdmin


@admin.register(SnapshotOutbox)
class SnapshotOutboxAdmin(_OutboxAdmin):
    """Changes not yet in Redis. Empty in normal operation; rows here mean Redis is failing."""

    list_display = ("id", "reason", "created_at", "attempts", "last_attempt_at", "last_error")
    readonly_fields = list_display

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: SnapshotOutbox | None = None
    ) -> bool:
        return False

    def has_delete_permission(
        self, request: HttpRequest, obj: SnapshotOutbox | None = None
    ) -> bool:
        return False
