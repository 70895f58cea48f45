"""What a request may use: the model (and the tenant's entitlement), the class, the deadline."""

from __future__ import annotations

import math
from collections.abc import Collection

from runtime.gateway.config import RouterConfig
from runtime.gateway.errors import ApiError
from runtime.snapshot import ModelSnap, RequestClassSnap, Snapshot, TenantSnap

CLASS_HEADER = "X-Switchyard-Class"
TIMEOUT_HEADER = "X-Request-Timeout"
MIN_TIMEOUT_S = 0.05  # below this no request can be served: a nonsensical header, a 400


def resolve_model(
    snapshot: Snapshot, tenant: TenantSnap, name: str, *, tasks: Collection[str], route: str
) -> ModelSnap:
    """The model named in the body: 404 unknown, 403 not entitled, 400 wrong route."""
    model = snapshot.models.get(name)
    if model is None:
        raise ApiError.of("model_not_found", param="model", model=name)
    if tenant.models and name not in tenant.models:
        raise ApiError.of("model_not_allowed", param="model", model=name)
    if model.task not in tasks:
        raise ApiError.of(
            "unsupported_model_task", param="model", model=name, task=model.task, route=route
        )
    return model


def resolve_class(
    snapshot: Snapshot, tenant: TenantSnap, requested: bytes | None
) -> RequestClassSnap | None:
    """The class named by the header (it must be one of the tenant's), else the default."""
    if requested is not None:
        name = requested.decode("latin-1").strip()
        if name not in tenant.classes or name not in snapshot.classes:
            raise ApiError.of(
                "class_not_allowed",
                param=CLASS_HEADER,
                klass=name,
                allowed=", ".join(tenant.classes) or "none",
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
        if not (math.isfinite(asked) and asked >= MIN_TIMEOUT_S):
            raise ApiError.of(
                "invalid_header",
                param=TIMEOUT_HEADER,
                header=TIMEOUT_HEADER,
                reason=f"must be a number of seconds, at least {MIN_TIMEOUT_S}.",
            )
        budget = min(budget, asked)
    return min(budget, config.max_deadline_s)
