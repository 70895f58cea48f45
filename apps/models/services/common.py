"""Helpers shared by the registry services (and the rollout and billing services)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet


def audit_state(obj: models.Model, fields: Iterable[str]) -> dict[str, Any]:
    """The values of ``fields`` on ``obj``, for an audit event's before/after (made JSON-safe
    by ``audit_record``)."""
    return {field: getattr(obj, field) for field in fields}


def refuse_unknown(changes: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Refuse an update that names a field the service does not let change."""
    unknown = sorted(set(changes) - set(allowed))
    if unknown:
        raise ValidationError(dict.fromkeys(unknown, "This field cannot be changed here."))


def exists_other(queryset: QuerySet[Any], exclude_pk: int | None) -> bool:
    """Whether ``queryset`` has a row other than ``exclude_pk`` (the object being edited)."""
    if exclude_pk is not None:
        queryset = queryset.exclude(pk=exclude_pk)
    return queryset.exists()
