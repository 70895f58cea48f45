"""Request classes (interactive / standard / batch ...): their SLOs and queue limits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.common.audit import audit_changes, audit_record
from apps.common.changes import audited_update
from apps.common.outbox import snapshot_publish_on_commit
from apps.tenants.models import MAX_HEARTBEAT_MS, RequestClass
from apps.tenants.services.checks import (
    CLASS_NAME_RE,
    SMALLINT_MAX,
    Errors,
    add_error,
    check_int,
)

REQUEST_CLASS_FIELDS = (
    "name",
    "priority_band",
    "ttft_slo_ms",
    "deadline_ms",
    "max_queue_length",
    "shed_order",
    "heartbeat_ms",
    "itl_slo_ms",
)


def request_class_validate_values(values: Mapping[str, Any]) -> None:
    """Check the request-class fields present in `values`; raise a per-field ValidationError.

    Called by the services (with every field) and by the admin form (with its cleaned data).
    """
    errors: Errors = {}
    if "name" in values:
        name = values["name"]
        if not isinstance(name, str) or not CLASS_NAME_RE.fullmatch(name):
            add_error(
                errors,
                "name",
                "Name must be 1-40 lower-case letters, digits, '-' or '_', starting with a letter.",
            )
    for field in ("priority_band", "shed_order"):
        if field in values:
            check_int(errors, field, values[field], minimum=0, maximum=SMALLINT_MAX)
    ttft_ok = "ttft_slo_ms" in values and check_int(
        errors, "ttft_slo_ms", values["ttft_slo_ms"], minimum=1
    )
    deadline_ok = "deadline_ms" in values and check_int(
        errors, "deadline_ms", values["deadline_ms"], minimum=1
    )
    if "max_queue_length" in values:
        check_int(errors, "max_queue_length", values["max_queue_length"], minimum=1)
    if "heartbeat_ms" in values:  # 0 turns heartbeats off
        check_int(errors, "heartbeat_ms", values["heartbeat_ms"], minimum=0,
                  maximum=MAX_HEARTBEAT_MS)  # fmt: skip
    if "itl_slo_ms" in values:
        check_int(errors, "itl_slo_ms", values["itl_slo_ms"], minimum=1)
    if ttft_ok and deadline_ok and values["deadline_ms"] < values["ttft_slo_ms"]:
        add_error(
            errors,
            "deadline_ms",
            f"Deadline ({values['deadline_ms']} ms) must not be shorter than the TTFT SLO "
            f"({values['ttft_slo_ms']} ms).",
        )
    if errors:
        raise ValidationError(errors)


def _state(request_class: RequestClass) -> dict[str, Any]:
    return {field: getattr(request_class, field) for field in REQUEST_CLASS_FIELDS}


def _check_name_free(name: str, *, exclude_pk: int | None = None) -> None:
    clash = RequestClass.objects.filter(name=name)
    if exclude_pk is not None:
        clash = clash.exclude(pk=exclude_pk)
    if clash.exists():
        raise ValidationError({"name": f"A request class named '{name}' already exists."})


def request_class_create(
    *,
    actor: AbstractBaseUser | None,
    name: str,
    priority_band: int,
    ttft_slo_ms: int,
    deadline_ms: int,
    max_queue_length: int,
    shed_order: int,
    heartbeat_ms: int = 5000,
    itl_slo_ms: int = 200,
) -> RequestClass:
    values = {
        "name": name,
        "priority_band": priority_band,
        "ttft_slo_ms": ttft_slo_ms,
        "deadline_ms": deadline_ms,
        "max_queue_length": max_queue_length,
        "shed_order": shed_order,
        "heartbeat_ms": heartbeat_ms,
        "itl_slo_ms": itl_slo_ms,
    }
    request_class_validate_values(values)
    _check_name_free(name)
    with transaction.atomic():
        request_class = RequestClass.objects.create(**values)
        audit_record(actor=actor, action="request_class.create", target=request_class, after=values)
        snapshot_publish_on_commit()
    return request_class


def request_class_update(
    *, actor: AbstractBaseUser | None, request_class: RequestClass, **changes: Any
) -> RequestClass:
    """Change any of the class's fields; a change that alters nothing writes nothing."""
    unknown = sorted(set(changes) - set(REQUEST_CLASS_FIELDS))
    if unknown:
        raise ValidationError(f"Request class fields that cannot be changed: {', '.join(unknown)}.")
    before = _state(request_class)
    merged = {**before, **changes}
    request_class_validate_values(merged)
    _, new = audit_changes(before, merged)
    if not new:
        return request_class
    if "name" in new:
        _check_name_free(new["name"], exclude_pk=request_class.pk)
    with transaction.atomic():
        audited_update(
            actor=actor, action="request_class.update", target=request_class, changes=new
        )
    return request_class
