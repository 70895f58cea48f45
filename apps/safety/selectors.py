"""Reads of safety: the snapshot's part (each pack name's newest version and who it applies
to) and a tenant's recent interventions."""

from __future__ import annotations

import logging

import msgspec
from django.db.models import QuerySet

from apps.safety.models import Intervention, PolicyAttachment, PolicyPack
from apps.tenants.models import Tenant
from runtime.snapshot import PolicyPackSnap, SafetySnap

logger = logging.getLogger(__name__)


def safety_snapshot() -> SafetySnap:
    """Every pack name's newest version, and the pack names per tenant slug and model name
    (three queries). A stored pack that no longer fits the schema is left out, with a warning."""
    packs: dict[str, PolicyPackSnap] = {}
    for row in PolicyPack.objects.order_by("name", "-version").distinct("name"):
        try:
            packs[row.name] = msgspec.convert(
                {"name": row.name, "version": row.version, "rules": row.rules}, PolicyPackSnap
            )
        except msgspec.ValidationError as exc:
            logger.warning("snapshot: policy pack %s is malformed (%s); left out", row, exc)
    tenants: dict[str, list[str]] = {}
    models: dict[str, list[str]] = {}
    rows = PolicyAttachment.objects.values_list("pack_name", "tenant__slug", "model__name")
    for pack_name, slug, model in rows.order_by("id"):
        if pack_name not in packs:
            continue
        if slug:
            tenants.setdefault(slug, []).append(pack_name)
        elif model:
            models.setdefault(model, []).append(pack_name)
    return SafetySnap(
        packs=packs,
        tenants={k: tuple(v) for k, v in tenants.items()},
        models={k: tuple(v) for k, v in models.items()},
    )


def interventions_of_tenant(tenant: Tenant) -> QuerySet[Intervention]:
    """The tenant's interventions, newest first."""
    return Intervention.objects.filter(tenant=tenant).order_by("-occurred_at", "-id")
