"""Policy packs, their attachments to tenants and models, and the interventions routers made.

A pack is a named, versioned list of rules (``rules``: JSON in the shape of
:class:`runtime.snapshot.SafetyRuleSnap`, validated by :func:`apps.safety.services.pack_validate`
where it is written). A new version is a new row; the snapshot carries each name's newest
version. Attachments name a pack (not a version), so publishing a new version applies it
wherever the name is attached.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from apps.models.models import Model
from apps.tenants.models import Tenant


class PolicyPack(models.Model):
    name = models.CharField(max_length=64, help_text="Letters, digits, '_', '.' or '-'.")
    version = models.PositiveIntegerField()
    rules = models.JSONField(default=list, help_text="The rules (see the safety user guide).")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["name", "-version"]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(fields=("name", "version"), name="safety_pack_name_version")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class PolicyAttachment(models.Model):
    """Pack ``pack_name`` applies to one tenant's requests, or to one model's."""

    pack_name = models.CharField(max_length=64)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    model = models.ForeignKey(
        Model, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["id"]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=(models.Q(tenant__isnull=False) & models.Q(model__isnull=True))
                | (models.Q(tenant__isnull=True) & models.Q(model__isnull=False)),
                name="safety_attachment_one_target",
            ),
            models.UniqueConstraint(
                fields=("pack_name", "tenant"), name="safety_attachment_tenant_once"
            ),
            models.UniqueConstraint(
                fields=("pack_name", "model"), name="safety_attachment_model_once"
            ),
        ]

    def __str__(self) -> str:
        target = f"tenant {self.tenant}" if self.tenant_id else f"model {self.model}"
        return f"{self.pack_name} on {target}"


class Intervention(models.Model):
    """A refusal, redaction or stop a router made; never any content (written once per event
    from the routers' stream, ``event_id`` makes a replayed entry a no-op)."""

    AUDIT_TENANT_FIELD: ClassVar[str] = "tenant"  # its audit events show in the tenant's log

    event_id = models.CharField(max_length=200, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    api_key = models.CharField(max_length=16, blank=True, help_text="The key's public prefix.")
    model = models.CharField(max_length=100, blank=True)
    request_id = models.CharField(max_length=100, blank=True)
    stage = models.CharField(max_length=16)
    action = models.CharField(max_length=16)
    pack = models.CharField(max_length=64)
    rule = models.CharField(max_length=64)
    matches = models.PositiveIntegerField(default=1)
    failed = models.CharField(max_length=8, blank=True, help_text="Classifier down: open/closed.")
    occurred_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["-occurred_at", "-id"]
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=("tenant", "-occurred_at"), name="safety_intervention_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.stage} {self.action} {self.pack}/{self.rule}"
