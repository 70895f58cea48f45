"""Fairness measures over served tokens (pure functions; telemetry exports them).

Service is weighted token cost (input + 2 * output). A tenant's *normalized* service is its
service divided by its weight; perfect weighted fairness makes every normalized service equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantShare:
    tenant: str
    served: float  # token cost served
    share: float  # fraction of all service
    entitled: float  # weight / sum of weights

    @property
    def ratio(self) -> float:
        """Served share over entitled share (1.0 is exactly fair); inf if entitled to 0."""
        if self.entitled == 0:
            return float("inf") if self.share > 0 else 1.0
        return self.share / self.entitled


def _check(served: Mapping[str, float], weights: Mapping[str, float]) -> None:
    missing = sorted(set(served) - set(weights))
    if missing:
        raise ValueError(f"no weight for tenant(s): {', '.join(missing)}")
    bad = sorted(t for t in served if not weights[t] > 0)
    if bad:
        raise ValueError(f"weights must be > 0; not for: {', '.join(bad)}")


def shares(served: Mapping[str, float], weights: Mapping[str, float]) -> list[TenantShare]:
    """Each tenant's share of service next to the share its weight entitles it to.

    Only the tenants in ``served`` count (pass the tenants that were backlogged: an idle
    tenant is entitled to nothing it did not ask for).
    """
    _check(served, weights)
    total = sum(served.values())
    total_weight = sum(weights[t] for t in served)
    return [
        TenantShare(
            tenant=tenant,
            served=value,
            share=value / total if total > 0 else 0.0,
            entitled=weights[tenant] / total_weight if total_weight > 0 else 0.0,
        )
        for tenant, value in sorted(served.items())
    ]


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 is equal, 1/n is one takes all."""
    xs = list(values)
    square_sum = sum(x * x for x in xs)
    if not xs or square_sum == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * square_sum)


def normalized(served: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Service divided by weight, per tenant."""
    _check(served, weights)
    return {tenant: value / weights[tenant] for tenant, value in served.items()}


def jain_fairness(served: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Jain's index over weight-normalized service."""
    return jain_index(normalized(served, weights).values())


def max_service_gap(served: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Largest difference in weight-normalized service between two tenants (0 if < 2)."""
    values = list(normalized(served, weights).values())
    return max(values) - min(values) if len(values) > 1 else 0.0
