"""Tenants: their status, fair-share weight, limits and request-class entitlements."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Model as DbModel

from apps.common.audit import audit_changes, audit_record
from apps.common.outbox import snapshot_publish_on_commit
from apps.tenants.models import RequestClass, Tenant
from apps.tenants.services.checks import (
    TENANT_SLUG_RE,
    Errors,
    add_error,
    check_int,
    check_positive_number,
    check_text,
)
from apps.tenants.services.retained import tenant_forget_on_commit

TENANT_LIMIT_FIELDS = (
    "rpm_limit",
    "tpm_limit",
    "max_concurrency",
    "max_context_tokens",
    "max_output_tokens",
)
_LIMIT_LABELS = {
    "rpm_limit": "Requests-per-minute limit",
    "tpm_limit": "Tokens-per-minute limit",
    "max_concurrency": "Max concurrency",
    "max_context_tokens": "Max context tokens",
    "max_output_tokens": "Max output tokens",
}
TENANT_UPDATABLE_FIELDS = frozenset(
    {
        "name",
        "weight",
        "status",
        *TENANT_LIMIT_FIELDS,
        "max_request_bytes",
        "result_cache",
        "zero_retention",
        "batch_file_retention_days",
        "allowed_classes",
        "default_class",
        "allowed_models",
    }
)
_SCALAR_FIELDS = (
    "name",
    "status",
    "weight",
    *TENANT_LIMIT_FIELDS,
    "max_request_bytes",
    "result_cache",
    "zero_retention",
    "batch_file_retention_days",
)

ClassRef = RequestClass | str
ModelRef = DbModel | str


def _check_switches(errors: Errors, values: Mapping[str, Any]) -> None:
    for switch, label in (("result_cache", "Result cache"), ("zero_retention", "Zero retention")):
        if switch in values and not isinstance(values[switch], bool):
            add_error(errors, switch, f"{label} must be true or false.")


def tenant_validate_values(values: Mapping[str, Any]) -> None:
    """Check the tenant fields present in `values`; raise a per-field ValidationError.

    `allowed_classes` is an iterable of RequestClass, `default_class` a RequestClass or None.
    Called by the services (with the full, merged set of values) and by the admin form.
    """
    errors: Errors = {}
    if "slug" in values:
        slug = values["slug"]
        if not isinstance(slug, str) or not TENANT_SLUG_RE.fullmatch(slug):
            add_error(
                errors,
                "slug",
                "Slug must be 1-63 lower-case letters, digits or inner hyphens "
                "(for example 'acme-labs').",
            )
    if "name" in values:
        check_text(errors, "name", values["name"], max_length=200)
    if "weight" in values:
        check_positive_number(errors, "weight", values["weight"])
    if "status" in values and values["status"] not in Tenant.Status.values:
        add_error(errors, "status", f"Status must be one of: {', '.join(Tenant.Status.values)}.")
    for field in TENANT_LIMIT_FIELDS:
        if field in values:
            check_int(errors, field, values[field], minimum=1, label=_LIMIT_LABELS[field])
    if "max_request_bytes" in values:  # 0: no cap of the tenant's own
        check_int(errors, "max_request_bytes", values["max_request_bytes"], minimum=0)
    _check_switches(errors, values)
    if values.get("batch_file_retention_days") is not None:  # None: kept until deleted
        check_int(errors, "batch_file_retention_days", values["batch_file_retention_days"],
                  minimum=1, label="Batch file retention (days)")  # fmt: skip
    default = values.get("default_class")
    if default is not None and "allowed_classes" in values:
        allowed = {request_class.pk for request_class in values["allowed_classes"]}
        if default.pk not in allowed:
            add_error(
                errors,
                "default_class",
                f"Default class '{default}' must be one of the tenant's allowed classes.",
            )
    if errors:
        raise ValidationError(errors)


def _resolve_class(ref: ClassRef, *, field: str) -> RequestClass:
    if isinstance(ref, RequestClass):
        return ref
    found = RequestClass.objects.filter(name=ref).first()
    if found is None:
        raise ValidationError({field: f"Unknown request class '{ref}'."})
    return found


def _resolve_classes(refs: Iterable[ClassRef]) -> list[RequestClass]:
    if isinstance(refs, str):
        raise ValidationError({"allowed_classes": "Allowed classes must be a list of classes."})
    resolved = {c.pk: c for c in (_resolve_class(r, field="allowed_classes") for r in refs)}
    return list(resolved.values())


def _catalog_model() -> type[DbModel]:
    """The registry's ``Model``, reached through the entitlement relation: the model registry
    is a layer above tenants, so tenants names it only in ``Tenant.allowed_models``."""
    related = Tenant._meta.get_field("allowed_models").related_model
    if not isinstance(related, type):  # pragma: no cover - the relation names a model class
        raise TypeError("Tenant.allowed_models must name a model class")
    return related


def _resolve_models(refs: Iterable[ModelRef]) -> list[DbModel]:
    """Models by object or name; an empty list means the tenant may use every model."""
    if isinstance(refs, str):
        raise ValidationError({"allowed_models": "Allowed models must be a list of models."})
    catalog = _catalog_model()
    resolved: dict[int, DbModel] = {}
    for ref in refs:
        found: DbModel | None = ref if isinstance(ref, catalog) else None
        if found is None:
            found = catalog._default_manager.filter(name=ref).first()
        if found is None:
            raise ValidationError({"allowed_models": f"Unknown model '{ref}'."})
        resolved[found.pk] = found
    return list(resolved.values())


def _values(tenant: Tenant) -> dict[str, Any]:
    """The tenant's current updatable values, classes as RequestClass objects."""
    values: dict[str, Any] = {field: getattr(tenant, field) for field in _SCALAR_FIELDS}
    values["allowed_classes"] = list(tenant.allowed_classes.all())
    values["default_class"] = tenant.default_class
    values["allowed_models"] = list(tenant.allowed_models.all())
    return values


def _state(values: Mapping[str, Any], *, creating: bool = False) -> dict[str, Any]:
    """JSON-friendly view of tenant values for the audit log (classes by name). A create
    records the result cache only when it is switched off (its default is on)."""
    state: dict[str, Any] = {"slug": values["slug"]} if "slug" in values else {}
    state.update({field: values[field] for field in _SCALAR_FIELDS})
    if creating and state["result_cache"] is True:
        del state["result_cache"]
    if creating and state["zero_retention"] is False:
        del state["zero_retention"]
    if creating and state["batch_file_retention_days"] is None:
        del state["batch_file_retention_days"]
    state["allowed_classes"] = sorted(c.name for c in values["allowed_classes"])
    default = values["default_class"]
    state["default_class"] = default.name if default is not None else None
    state["allowed_models"] = sorted(m.name for m in values.get("allowed_models", ()))
    return state


def tenant_create(
    *,
    actor: AbstractBaseUser | None,
    slug: str,
    name: str,
    weight: float = 1.0,
    rpm_limit: int,
    tpm_limit: int,
    max_concurrency: int,
    max_context_tokens: int,
    max_output_tokens: int,
    max_request_bytes: int = 0,
    result_cache: bool = True,
    zero_retention: bool = False,
    batch_file_retention_days: int | None = None,
    allowed_classes: Iterable[ClassRef] = (),
    default_class: ClassRef | None = None,
    allowed_models: Iterable[ModelRef] = (),
) -> Tenant:
    """Create an active tenant. Classes may be given as RequestClass objects or names."""
    classes = _resolve_classes(allowed_classes)
    models = _resolve_models(allowed_models)
    default = _resolve_class(default_class, field="default_class") if default_class else None
    values: dict[str, Any] = {
        "slug": slug,
        "name": name,
        "status": Tenant.Status.ACTIVE.value,
        "weight": weight,
        "rpm_limit": rpm_limit,
        "tpm_limit": tpm_limit,
        "max_concurrency": max_concurrency,
        "max_context_tokens": max_context_tokens,
        "max_output_tokens": max_output_tokens,
        "max_request_bytes": max_request_bytes,
        "result_cache": result_cache,
        "zero_retention": zero_retention,
        "batch_file_retention_days": batch_file_retention_days,
        "allowed_classes": classes,
        "default_class": default,
        "allowed_models": models,
    }
    tenant_validate_values(values)
    values["weight"] = float(weight)
    if Tenant.objects.filter(slug=slug).exists():
        raise ValidationError({"slug": f"A tenant with slug '{slug}' already exists."})
    with transaction.atomic():
        m2m = ("allowed_classes", "allowed_models")
        fields = {k: v for k, v in values.items() if k not in m2m}
        tenant = Tenant.objects.create(**fields)
        tenant.allowed_classes.set(classes)
        tenant.allowed_models.set([model.pk for model in models])
        after = _state(values, creating=True)
        audit_record(actor=actor, action="tenant.create", target=tenant, after=after)
        snapshot_publish_on_commit()
    return tenant


def _tenant_apply(
    *, actor: AbstractBaseUser | None, tenant: Tenant, action: str, changes: Mapping[str, Any]
) -> Tenant:
    current = _values(tenant)
    merged = {**current, **changes}
    tenant_validate_values(merged)
    merged["weight"] = float(merged["weight"])
    before, after = audit_changes(_state(current), _state(merged))
    if not after:
        return tenant
    with transaction.atomic():
        scalar = [field for field in (*_SCALAR_FIELDS, "default_class") if field in after]
        for field in scalar:
            setattr(tenant, field, merged[field])
        tenant.save(update_fields=[*scalar, "updated_at"])
        if "allowed_classes" in after:
            tenant.allowed_classes.set(merged["allowed_classes"])
        if "allowed_models" in after:
            tenant.allowed_models.set(merged["allowed_models"])
        audit_record(actor=actor, action=action, target=tenant, before=before, after=after)
        snapshot_publish_on_commit()
        if after.get("zero_retention") is True:
            tenant_forget_on_commit(tenant.slug)
    return tenant


def tenant_update(*, actor: AbstractBaseUser | None, tenant: Tenant, **changes: Any) -> Tenant:
    """Change name, weight, status, the five limits, max_request_bytes, result_cache,
    zero_retention (switched on: the tenant's stored entries are deleted after the commit),
    batch_file_retention_days (None: Batch API files kept until deleted),
    allowed_classes/_models, default_class.

    The slug is the tenant's identity (snapshot key, billing) and cannot change. A change
    that alters nothing writes nothing.
    """
    unknown = sorted(set(changes) - TENANT_UPDATABLE_FIELDS)
    if unknown:
        raise ValidationError(f"Tenant fields that cannot be changed: {', '.join(unknown)}.")
    resolved = dict(changes)
    if "allowed_classes" in changes:
        resolved["allowed_classes"] = _resolve_classes(changes["allowed_classes"])
    if "allowed_models" in changes:
        resolved["allowed_models"] = _resolve_models(changes["allowed_models"])
    if changes.get("default_class") is not None:
        resolved["default_class"] = _resolve_class(changes["default_class"], field="default_class")
    return _tenant_apply(actor=actor, tenant=tenant, action="tenant.update", changes=resolved)


def tenant_suspend(*, actor: AbstractBaseUser | None, tenant: Tenant) -> Tenant:
    """Suspend an active tenant: the data plane refuses its requests from the next snapshot."""
    if tenant.status == Tenant.Status.SUSPENDED:
        raise ValidationError({"status": f"Tenant '{tenant.slug}' is already suspended."})
    changes = {"status": Tenant.Status.SUSPENDED.value}
    return _tenant_apply(actor=actor, tenant=tenant, action="tenant.suspend", changes=changes)


def tenant_activate(*, actor: AbstractBaseUser | None, tenant: Tenant) -> Tenant:
    """Re-activate a suspended tenant."""
    if tenant.status == Tenant.Status.ACTIVE:
        raise ValidationError({"status": f"Tenant '{tenant.slug}' is already active."})
    changes = {"status": Tenant.Status.ACTIVE.value}
    return _tenant_apply(actor=actor, tenant=tenant, action="tenant.activate", changes=changes)
