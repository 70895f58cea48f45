"""What the scaling page shows per pool, as plain dicts (page load and the staff feed).

Per pool: its bounds, its replicas by endpoint state (serving = ready, warm = starting,
draining), the controller's desired vs actual replicas over the last :data:`HISTORY_S`
seconds (one point per recorded decision) and its most recent decisions with the signals they
saw and the reason. Read through ``apps.scaling.selectors`` and the model registry.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from apps.models.models import Endpoint, Pool
from apps.scaling.models import ScalingDecision
from apps.scaling.selectors import decisions_for_pool

HISTORY_S = 600  # what the charts keep (10 minutes)
HISTORY_POINTS = 240
RECENT = 10


def _replicas(pool: Pool, counts: dict[tuple[int, str], int]) -> dict[str, int]:
    return {
        "serving": counts.get((pool.pk, Endpoint.State.READY), 0),
        "warm": counts.get((pool.pk, Endpoint.State.STARTING), 0),
        "draining": counts.get((pool.pk, Endpoint.State.DRAINING), 0),
    }


def _decision(decision: ScalingDecision) -> dict[str, Any]:
    return {
        "id": decision.pk,
        "at": decision.created_at.isoformat(timespec="seconds"),
        "action": decision.action,
        "current": decision.current,
        "desired": decision.desired,
        "reason": decision.reason,
        "policy": decision.policy,
        "actuator": decision.actuator,
        "signals": _signals(decision.signals),
        "error": decision.error,
    }


def _signals(signals: Any) -> str:
    """The decision's signal values as ``name value`` pairs (nested dicts flattened)."""
    if not isinstance(signals, dict):
        return ""
    parts = []
    for name, value in signals.items():
        if name in ("pool", "at"):
            continue
        if isinstance(value, dict):
            inner = ", ".join(f"{k}: {v}" for k, v in value.items())
            parts.append(f"{name} {{{inner}}}" if inner else f"{name} {{}}")
        elif isinstance(value, float):
            parts.append(f"{name} {value:.3g}")
        else:
            parts.append(f"{name} {value}")
    return "; ".join(parts)


def scaling_view() -> list[dict[str, Any]]:
    """One entry per pool, by name."""
    pools = list(Pool.objects.select_related("scaling").order_by("name"))
    counts = {
        (row["pool_id"], row["state"]): row["n"]
        for row in Endpoint.objects.values("pool_id", "state").annotate(n=Count("id"))
    }
    since = timezone.now() - timedelta(seconds=HISTORY_S)
    views = []
    for pool in pools:
        recent = list(decisions_for_pool(pool=pool, limit=HISTORY_POINTS))  # newest first
        history = [d for d in recent if d.created_at >= since]
        scaling = getattr(pool, "scaling", None)
        views.append(
            {
                "pool": pool.name,
                "tier": pool.hardware_tier,
                "min": pool.min_replicas,
                "max": pool.max_replicas,
                "warm_target": pool.warm_replicas,
                "enabled": scaling.enabled if scaling is not None else True,
                "replicas": _replicas(pool, counts),
                "history": [
                    [d.created_at.timestamp(), d.current, d.desired] for d in reversed(history)
                ],
                "decisions": [_decision(d) for d in recent[:RECENT]],
            }
        )
    return views
