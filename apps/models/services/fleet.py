"""Registry services for pools and the endpoints (replicas) that serve versions in them."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from apps.common import validation as cv
from apps.common.audit import audit_record, audit_state
from apps.common.changes import audited_save, audited_update
from apps.common.outbox import snapshot_publish_on_commit
from apps.common.validation import exists_other, refuse_unknown
from apps.models import validators as v
from apps.models.models import Endpoint, ModelVersion, Pool

POOL_FIELDS = (
    "name",
    "hardware_tier",
    "cost_per_replica_hour",
    "min_replicas",
    "max_replicas",
    "warm_replicas",
    "policies",
)

# endpoint state -> states it may move to
ENDPOINT_TRANSITIONS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        Endpoint.State.STARTING: frozenset(
            {Endpoint.State.READY, Endpoint.State.DRAINING, Endpoint.State.GONE}
        ),
        Endpoint.State.READY: frozenset({Endpoint.State.DRAINING, Endpoint.State.GONE}),
        Endpoint.State.DRAINING: frozenset({Endpoint.State.GONE, Endpoint.State.READY}),
        Endpoint.State.GONE: frozenset(),
    }
)


# --- pools ----------------------------------------------------------------------------------


def pool_validate(
    *,
    name: str,
    hardware_tier: str,
    cost_per_replica_hour: Decimal | int | str,
    min_replicas: int,
    max_replicas: int,
    warm_replicas: int,
    policies: object,
    exclude_pk: int | None = None,
) -> None:
    name_error = (
        None
        if isinstance(name, str) and v.POOL_NAME_RE.fullmatch(name)
        else (
            "Pool name must be 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit."
        )
    )
    if name_error is None and exists_other(Pool.objects.filter(name=name), exclude_pk):
        name_error = f"A pool named {name!r} already exists."
    counts = {
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "warm_replicas": warm_replicas,
    }
    errors: dict[str, Any] = {
        field: "Must be an integer from 0 to 10000."
        for field, count in counts.items()
        if not cv.is_int(count) or not 0 <= count <= 10000
    }
    if not errors:
        if min_replicas > max_replicas:
            errors["min_replicas"] = "Minimum replicas must not exceed maximum replicas."
        elif warm_replicas > max_replicas:  # extra loaded, unrouted replicas (apps.scaling)
            errors["warm_replicas"] = "Warm replicas must lie between 0 and maximum replicas."
    tier_ok = isinstance(hardware_tier, str) and v.TIER_RE.fullmatch(hardware_tier)
    cv.raise_if(
        {
            "name": name_error,
            "hardware_tier": None
            if tier_ok
            else "Hardware tier must be 1-32 lowercase characters, e.g. h100, cpu.",
            "cost_per_replica_hour": cv.decimal_error(
                cost_per_replica_hour, max_digits=12, decimal_places=4
            ),
            "policies": v.pool_policies_error(policies),
            **errors,
        }
    )


def pool_create(
    *,
    actor: AbstractBaseUser | None,
    name: str,
    hardware_tier: str,
    cost_per_replica_hour: Decimal | int | str,
    min_replicas: int = 0,
    max_replicas: int = 1,
    warm_replicas: int = 0,
    policies: dict[str, str] | None = None,
) -> Pool:
    fields: dict[str, Any] = {
        "name": name,
        "hardware_tier": hardware_tier,
        "cost_per_replica_hour": cost_per_replica_hour,
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "warm_replicas": warm_replicas,
        "policies": {} if policies is None else policies,
    }
    pool_validate(**fields)
    fields["cost_per_replica_hour"] = cv.to_decimal(cost_per_replica_hour)
    with transaction.atomic():
        try:
            with transaction.atomic():
                pool = Pool.objects.create(**fields)
        except IntegrityError as exc:
            raise ValidationError({"name": f"A pool named {name!r} already exists."}) from exc
        audit_record(
            actor=actor, action="pool.create", target=pool, after=audit_state(pool, POOL_FIELDS)
        )
        snapshot_publish_on_commit()
    return pool


def pool_update(*, actor: AbstractBaseUser | None, pool: Pool, **changes: Any) -> Pool:
    """Change any of :data:`POOL_FIELDS`; ``pool`` is refreshed in place and returned."""
    refuse_unknown(changes, POOL_FIELDS)
    with transaction.atomic():
        locked = Pool.objects.select_for_update().get(pk=pool.pk)
        pool_validate(
            **{**{f: getattr(locked, f) for f in POOL_FIELDS}, **changes}, exclude_pk=locked.pk
        )
        if "cost_per_replica_hour" in changes:
            changes["cost_per_replica_hour"] = cv.to_decimal(changes["cost_per_replica_hour"])
        audited_save(
            actor=actor,
            action="pool.update",
            target=locked,
            changes=changes,
            fields=POOL_FIELDS,
            clash={"name": "Another pool has that name."},
        )
    pool.refresh_from_db()
    return pool


# --- endpoints ------------------------------------------------------------------------------


def endpoint_validate(*, pool: Pool, version: ModelVersion, base_url: str, capacity: int) -> None:
    url_error = cv.http_url_error(base_url)
    if (
        url_error is None
        and Endpoint.objects.filter(base_url=base_url.rstrip("/"))
        .exclude(state=Endpoint.State.GONE)
        .exists()
    ):
        url_error = f"A live endpoint already serves {base_url.rstrip('/')}; mark it gone first."
    published = ModelVersion.objects.filter(pk=version.pk, published_at__isnull=False).exists()
    cv.raise_if(
        {
            "version": None
            if published
            else f"Version {version} is not published; publish it first.",
            "base_url": url_error,
            "capacity": None
            if cv.is_int(capacity) and capacity > 0
            else "Capacity must be a positive integer.",
        }
    )


def endpoint_register(
    *,
    actor: AbstractBaseUser | None,
    pool: Pool,
    version: ModelVersion,
    base_url: str,
    capacity: int,
    kv_events_url: str = "",
) -> Endpoint:
    """Register a replica of a published version in a pool; it starts in state ``starting``.
    ``kv_events_url`` (``tcp://host:port``) is where its engine publishes KV cache events."""
    endpoint_validate(pool=pool, version=version, base_url=base_url, capacity=capacity)
    if kv_events_url and not kv_events_url.startswith("tcp://"):
        raise ValidationError({"kv_events_url": "KV events are published on tcp://host:port."})
    with transaction.atomic():
        try:
            with transaction.atomic():
                endpoint = Endpoint.objects.create(
                    pool=pool,
                    version=version,
                    base_url=base_url.rstrip("/"),
                    capacity=capacity,
                    kv_events_url=kv_events_url,
                )
        except IntegrityError as exc:
            raise ValidationError({"base_url": "A live endpoint already serves this URL."}) from exc
        audit_record(
            actor=actor,
            action="endpoint.register",
            target=endpoint,
            after=audit_state(endpoint, ["pool_id", "version_id", "base_url", "capacity", "state"]),
        )
        snapshot_publish_on_commit()
    return endpoint


def endpoint_transition_validate(*, endpoint: Endpoint, state: str) -> None:
    if state not in Endpoint.State.values:
        raise ValidationError({"state": f"State must be one of {Endpoint.State.values}."})
    allowed = ENDPOINT_TRANSITIONS[Endpoint.State(endpoint.state)]
    if state != endpoint.state and state not in allowed:
        targets = ", ".join(sorted(allowed)) or "nothing (gone is final)"
        raise ValidationError(
            {
                "state": f"An endpoint cannot go from {endpoint.state} to {state}; "
                f"allowed: {targets}."
            }
        )


def endpoint_set_state(
    *, actor: AbstractBaseUser | None, endpoint: Endpoint, state: str
) -> Endpoint:
    """Move an endpoint along its lifecycle (see :data:`ENDPOINT_TRANSITIONS`).

    Setting the current state again is a no-op. ``endpoint`` is refreshed in place and returned.
    """
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        endpoint_transition_validate(endpoint=locked, state=state)
        if state != locked.state:
            audited_update(
                actor=actor, action="endpoint.set_state", target=locked, changes={"state": state}
            )
    endpoint.refresh_from_db()
    return endpoint
