"""Registry service for routes: how a model's traffic splits across its published versions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction

from apps.common import validation as cv
from apps.common.audit import audit_record
from apps.common.outbox import snapshot_publish_on_commit
from apps.models.models import Model, ModelVersion, Route, RouteSplit


def route_validate(
    *, model: Model, splits: Sequence[tuple[ModelVersion, int]], sticky_key: str
) -> None:
    """Rules for a route: at least one split, each a distinct published version of ``model``
    with a positive integer weight (weights are relative, they need not sum to 100)."""
    errors: list[str] = []
    if not splits:
        errors.append("A route needs at least one split.")
    published = set(
        ModelVersion.objects.filter(
            pk__in=[version.pk for version, _weight in splits], published_at__isnull=False
        ).values_list("pk", flat=True)
    )
    seen: set[int] = set()
    for version, weight in splits:
        if version.model_id != model.pk:
            errors.append(f"Version {version} does not belong to model {model.name!r}.")
        elif version.pk not in published:
            errors.append(f"Version {version} is not published.")
        if version.pk in seen:
            errors.append(f"Version {version} appears more than once.")
        seen.add(version.pk)
        if not cv.is_int(weight) or weight <= 0:
            errors.append(f"Weight of {version} must be a positive integer, not {weight!r}.")
    cv.raise_if(
        {
            "splits": errors,
            "sticky_key": None
            if sticky_key in Route.StickyKey.values
            else f"Sticky key must be one of {Route.StickyKey.values}.",
        }
    )


def _route_state(route: Route) -> dict[str, Any]:
    splits = [
        {"version": s.version_id, "weight": s.weight} for s in route.splits.order_by("version_id")
    ]
    return {"sticky_key": route.sticky_key, "splits": splits}


def route_set(
    *,
    actor: AbstractBaseUser | None,
    model: Model,
    splits: Sequence[tuple[ModelVersion, int]],
    sticky_key: str = Route.StickyKey.TENANT,
) -> Route:
    """Replace how a model's traffic is split across its published versions."""
    route_validate(model=model, splits=splits, sticky_key=sticky_key)
    with transaction.atomic():
        route, created = Route.objects.select_for_update().get_or_create(
            model=model, defaults={"sticky_key": sticky_key}
        )
        before = None if created else _route_state(route)
        route.sticky_key = sticky_key
        route.save()
        route.splits.all().delete()
        RouteSplit.objects.bulk_create(
            RouteSplit(route=route, version=version, weight=weight) for version, weight in splits
        )
        audit_record(
            actor=actor, action="route.set", target=route, before=before, after=_route_state(route)
        )
        snapshot_publish_on_commit()
    return route
