"""What a request may use: the model (and the tenant's entitlement), the class, the deadline."""

from __future__ import annotations

import math
from collections.abc import Collection

from runtime.gateway.config import RouterConfig
from runtime.gateway.errors import ApiError
from runtime.snapshot import ModelSnap, RequestClassSnap, Snapshot, TenantSnap

CLASS_HEADER = "X-Switchyard-Class"
TIMEOUT_HEADER = "X-Request-Timeout"


def resolve_model(
    snapshot: Snapshot, tenant: TenantSnap, name: str, *, tasks: Collection[str], route: str
) -> ModelSnap:
    """The model named in the body: 404 unknown, 403 not entitled, 400 wrong route."""
    model = snapshot.models.get(name)
    if model is None:
        raise ApiError.of("model_not_found", f"The model '{name}' does not exist.", param="model")
    if tenant.models and name not in tenant.models:
        raise ApiError.of(
            "model_not_allowed",
            f"Your tenant is not allowed to use the model '{name}'.",
            param="model",
        )
    if model.task not in tasks:
        raise ApiError.of(
            "unsupported_model_task",
            f"The model '{name}' is a {model.task} model; it is not served on {route}.",
            param="model",
        )
    return model


def resolve_class(
    snapshot: Snapshot, tenant: TenantSnap, requested: bytes | None
) -> RequestClassSnap | None:
    """The class named by the header (it must be one of the tenant's), else the default."""
    if requested is not None:
        name = requested.decode("latin-1").strip()
        if name not in tenant.classes or name not in snapshot.classes:
            allowed = ", ".join(tenant.classes) or "none"
            raise ApiError.of(
                "class_not_allowed",
                f"Request class '{name}' is not available to your tenant (allowed: {allowed}).",
                param=CLASS_HEADER,
            )
        return snapshot.classes[name]
    if tenant.default_class:
        return snapshot.classes.get(tenant.default_class)
    return None


def resolve_timeout(
    klass: RequestClassSnap | None, requested: bytes | None, config: RouterConfig
) -> float:
    """Seconds the request may take: min(client header, class deadline, router maximum)."""
    budget = config.default_deadline_s if klass is None else klass.deadline_ms / 1000.0
    if requested is not None:
        try:
            asked = float(requested.decode("latin-1").strip())
        except ValueError:
            asked = math.nan
        if not (math.isfinite(asked) and asked > 0):
            raise ApiError.of(
                "invalid_header",
                f"{TIMEOUT_HEADER} must be a positive number of seconds.",
                param=TIMEOUT_HEADER,
            )
        budget = min(budget, asked)
    return min(budget, config.max_deadline_s)
