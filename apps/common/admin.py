"""Admin for the base app's tables, both read-only: the audit log (append-only) and the
snapshot outbox (the drain task owns it)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.common.admin_support import ModelAdminBase
from apps.common.models import AuditEvent, SnapshotOutbox


class ReadOnlyAdmin(ModelAdminBase[Any]):
    """Lists and shows rows; refuses add, change and delete."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Read-only: the log is append-only (model, queryset and a database trigger refuse)."""

    list_display = ("created_at", "actor_label", "action", "target_type", "target_repr")
    list_filter = ("action", "target_type")
    search_fields = ("actor_label", "action", "target_repr", "target_id")
    date_hierarchy = "created_at"


@admin.register(SnapshotOutbox)
class SnapshotOutboxAdmin(ReadOnlyAdmin):
    """Changes not yet in Redis. Empty in normal operation; rows here mean Redis is failing."""

    list_display = ("id", "reason", "created_at", "attempts", "last_attempt_at", "last_error")
    readonly_fields = list_display
