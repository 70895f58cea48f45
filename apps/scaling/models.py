"""Autoscaling records: a pool's scaling settings and history, every decision, start times."""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.validators import MinValueValidator
from django.db import models

from apps.common.retention_policy import Retention
from apps.models.models import ModelVersion, Pool


class PoolScaling(models.Model):
    """How one pool scales (target band, cooldowns, idle time) and when it last scaled."""

    pool = models.OneToOneField(Pool, on_delete=models.CASCADE, related_name="scaling")
    enabled = models.BooleanField(default=True)
    policy = models.CharField(
        max_length=32, blank=True, help_text='"gpu" or "cpu"; blank: by the hardware tier.'
    )
    target_low = models.FloatField(default=0.4, validators=[MinValueValidator(0.01)])
    target_high = models.FloatField(default=0.8, validators=[MinValueValidator(0.02)])
    wait_slo_s = models.FloatField(default=1.0, validators=[MinValueValidator(0.001)])
    out_cooldown_s = models.FloatField(default=5.0, validators=[MinValueValidator(0)])
    in_cooldown_s = models.FloatField(default=60.0, validators=[MinValueValidator(0)])
    idle_to_zero_s = models.FloatField(
        null=True, blank=True, default=300.0, help_text="Empty: never scale to zero."
    )
    version = models.ForeignKey(
        ModelVersion, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
        help_text="What the local actuator starts in a pool that never ran a replica.",
    )  # fmt: skip
    last_out_at = models.FloatField(null=True, blank=True)  # unix time
    last_in_at = models.FloatField(null=True, blank=True)
    idle_since = models.FloatField(null=True, blank=True)

    class Meta:
        constraints: ClassVar[list[Any]] = [
            models.CheckConstraint(
                condition=models.Q(target_low__lt=models.F("target_high")),
                name="scaling_band_ordered",
            ),
        ]

    def __str__(self) -> str:
        return f"scaling of {self.pool_id}"


class ScalingDecision(models.Model):
    """One controller decision for a pool: the signals it saw, what it chose and why."""

    class Action(models.TextChoices):
        OUT = "out", "Scale out"
        IN = "in", "Scale in"
        HOLD = "hold", "Hold"
        ZERO = "zero", "Scale to zero"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="scaling_decisions")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    policy = models.CharField(max_length=32)
    actuator = models.CharField(max_length=32)
    action = models.CharField(max_length=8, choices=Action.choices)
    current = models.PositiveIntegerField()
    desired = models.PositiveIntegerField()
    reason = models.TextField()
    signals = models.JSONField(default=dict)
    promoted = models.PositiveIntegerField(default=0)
    started = models.PositiveIntegerField(default=0)
    stopped = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    retention: ClassVar[Retention] = Retention("scaling_decisions", "created_at")

    class Meta:
        ordering: ClassVar[list[str]] = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.pool_id}: {self.action} {self.current}->{self.desired}"


class ReplicaStart(models.Model):
    """How long one replica took from the actuator's start to ready (warm: a promotion)."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="replica_starts")
    version = models.ForeignKey(
        ModelVersion, on_delete=models.CASCADE, related_name="replica_starts"
    )
    warm = models.BooleanField()
    seconds = models.FloatField(validators=[MinValueValidator(0)])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"v{self.version_id} {'warm' if self.warm else 'cold'} {self.seconds:.2f}s"
