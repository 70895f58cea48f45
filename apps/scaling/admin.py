from __future__ import annotations

from django.contrib import admin

from apps.scaling.models import PoolScaling, ReplicaStart, ScalingDecision


@admin.register(PoolScaling)
class PoolScalingAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("pool", "enabled", "policy", "target_low", "target_high", "idle_to_zero_s")
    readonly_fields = ("last_out_at", "last_in_at", "idle_since")


@admin.register(ScalingDecision)
class ScalingDecisionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("created_at", "pool", "action", "current", "desired", "reason", "error")
    list_filter = ("action", "pool")
    readonly_fields = [f.name for f in ScalingDecision._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(ReplicaStart)
class ReplicaStartAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("created_at", "pool", "version", "warm", "seconds")
    list_filter = ("warm", "pool")
