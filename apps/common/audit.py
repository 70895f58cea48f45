"""The audit log: one append-only `AuditEvent` per control-plane change."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from apps.common.models import AuditEvent

SYSTEM_ACTOR_LABEL = "system"


class _AuditEncoder(DjangoJSONEncoder):
    """DjangoJSONEncoder, but datetimes keep their microseconds (ISO 8601)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, datetime):
            return o.isoformat()
        return super().default(o)


def _json_safe(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A plain-JSON copy (datetimes, decimals and UUIDs become strings)."""
    if value is None:
        return None
    result: dict[str, Any] = json.loads(json.dumps(dict(value), cls=_AuditEncoder))
    return result


def audit_state(obj: models.Model, fields: Iterable[str]) -> dict[str, Any]:
    """The values of ``fields`` on ``obj``, for an audit event's before/after (made JSON-safe
    by ``audit_record``)."""
    return {field: getattr(obj, field) for field in fields}


def audit_changes(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields whose value differs, as (before, after) dicts holding only those fields."""
    changed = [key for key in after if before.get(key) != after[key]]
    return {key: before.get(key) for key in changed}, {key: after[key] for key in changed}


def audit_record(
    *,
    actor: AbstractBaseUser | None,
    action: str,
    target: models.Model,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit event. `actor=None` means the system did it."""
    return AuditEvent.objects.create(
        actor_id=actor.pk if actor is not None else None,
        actor_label=actor.get_username() if actor is not None else SYSTEM_ACTOR_LABEL,
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        target_repr=str(target)[:200],
        before=_json_safe(before),
        after=_json_safe(after),
    )
