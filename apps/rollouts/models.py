"""Rollouts of a candidate version against a stable one, and their event log (data only)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.db import models

from apps.common.retention_policy import Retention
from apps.models.models import Model, ModelVersion

ACTIVE_STATES = ("pending", "warming", "running", "paused")
# States in which the candidate may hold traffic (the snapshot carries the rollout's exclusions).
TRAFFIC_STATES = ("running", "paused")


class Rollout(models.Model):
    class Mode(models.TextChoices):
        CANARY = "canary", "Canary"
        AB = "ab", "A/B"
        SHADOW = "shadow", "Shadow"

    class State(models.TextChoices):
        PENDING = "pending", "Draft"
        WARMING = "warming", "Warming"
        RUNNING = "running", "Running"
        PAUSED = "paused", "Paused"
        PROMOTED = "promoted", "Promoted"
        ROLLED_BACK = "rolled_back", "Rolled back"
        ABORTED = "aborted", "Aborted"
        CANCELLED = "cancelled", "Cancelled"

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="rollouts")
    stable_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    candidate_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.CANARY)
    steps = models.JSONField(
        default=list, help_text="Candidate traffic percentages, e.g. [1, 5, 25, 50, 100]."
    )
    current_step = models.PositiveSmallIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    max_error_rate_delta = models.FloatField(
        default=0.01, help_text="Candidate error rate may exceed stable's by at most this."
    )
    max_ttft_p95_ratio = models.FloatField(default=1.2)
    max_itl_p95_ratio = models.FloatField(
        default=1.2,
        help_text="Candidate inter-token latency p95 may be at most this ratio to stable's.",
    )
    max_cost_ratio = models.FloatField(default=1.1)
    step_window_s = models.PositiveIntegerField(
        default=300, help_text="Minimum seconds per step; also the gates' comparison window."
    )
    min_samples = models.PositiveIntegerField(
        default=200, help_text="Requests each version needs in the window before a gate decides."
    )
    max_step_increase = models.PositiveSmallIntegerField(
        default=100,
        help_text="Blast radius: a step may raise the candidate's share by at most this.",
    )
    excluded_tenants = models.JSONField(
        default=list, blank=True, help_text="Tenant slugs that always get the stable version."
    )
    sticky_header = models.CharField(
        max_length=64,
        blank=True,
        help_text="Assign versions by this request header's value (e.g. X-Session-Id) instead "
        "of the route's key (tenant or the request's user field). Requests without the header "
        "fall back to the route's key.",
    )
    warmup_endpoints = models.JSONField(
        default=list,
        blank=True,
        help_text="Endpoint ids the warm-up started for the candidate (drained after a "
        "rollback or an abort).",
    )
    step_started_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["-created_at"]
        constraints: ClassVar[list[Any]] = [
            models.UniqueConstraint(
                fields=["model"],
                condition=models.Q(state__in=ACTIVE_STATES),
                name="rollout_one_active_per_model",
            ),
            models.CheckConstraint(
                condition=~models.Q(stable_version=models.F("candidate_version")),
                name="rollout_distinct_versions",
            ),
        ]

    def __str__(self) -> str:
        versions = f"{self.stable_version_id}→{self.candidate_version_id}"
        return f"{self.model.name}: {versions} ({self.state})"


class RolloutEvent(models.Model):
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    step = models.PositiveSmallIntegerField(default=0)
    actor_label = models.CharField(max_length=150)
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    retention: ClassVar[Retention] = Retention("rollout_events", "created_at")

    class Meta:
        ordering: ClassVar[list[str]] = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.rollout_id} {self.kind}"
