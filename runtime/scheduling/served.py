"""Service served per tenant in one pool: cumulative tokens, and a recent window for fairness.

The cumulative counts (input and output tokens) feed a Prometheus counter. The window is the
weighted token cost (input + 2 * output, see :func:`~runtime.scheduling.interfaces.token_cost`)
decayed exponentially with ``half_life_s``, kept together with the last time each tenant had
to queue: fairness is only owed among tenants that were *contending*, so the entitled shares
and Jain's index (:mod:`runtime.scheduling.metrics`) are computed over the tenants that
queued within the window (see :meth:`ServedTokens.fairness`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from runtime.scheduling.metrics import jain_fairness, shares


@dataclass(slots=True)
class _Tenant:
    weight: float = 1.0
    input_tokens: int = 0
    output_tokens: int = 0
    recent: float = 0.0  # decayed weighted cost, as of ``at``
    at: float = 0.0
    queued_at: float = -math.inf  # last time it had a request waiting


@dataclass(frozen=True, slots=True)
class FairnessView:
    """Shares over the contending tenants of the recent window."""

    served_share: dict[str, float] = field(default_factory=dict)
    entitled_share: dict[str, float] = field(default_factory=dict)
    jain: float = 1.0


class ServedTokens:
    __slots__ = ("_half_life_s", "_tenants")

    def __init__(self, *, half_life_s: float = 30.0) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s!r}")
        self._half_life_s = half_life_s
        self._tenants: dict[str, _Tenant] = {}

    def _tenant(self, tenant: str) -> _Tenant:
        entry = self._tenants.get(tenant)
        if entry is None:
            entry = self._tenants[tenant] = _Tenant()
        return entry

    def _decayed(self, entry: _Tenant, now: float) -> float:
        if now <= entry.at:
            return entry.recent
        return entry.recent * math.pow(0.5, (now - entry.at) / self._half_life_s)

    def queued(self, tenant: str, weight: float, now: float) -> None:
        """``tenant`` has a request waiting (it is contending) at ``now``."""
        entry = self._tenant(tenant)
        entry.weight = weight
        entry.queued_at = now

    def add(
        self, tenant: str, *, weight: float, input_tokens: int, output_tokens: int, now: float
    ) -> None:
        entry = self._tenant(tenant)
        entry.weight = weight
        entry.input_tokens += input_tokens
        entry.output_tokens += output_tokens
        entry.recent = self._decayed(entry, now) + input_tokens + 2.0 * output_tokens
        entry.at = max(entry.at, now)

    def totals(self) -> dict[str, tuple[int, int]]:
        """Tenant → (input tokens, output tokens) served since start."""
        return {t: (e.input_tokens, e.output_tokens) for t, e in self._tenants.items()}

    def fairness(self, now: float) -> FairnessView:
        """Served versus entitled share, and Jain's index, over the contending tenants."""
        horizon = now - 2.0 * self._half_life_s
        served = {
            t: self._decayed(e, now)
            for t, e in self._tenants.items()
            if e.queued_at >= horizon and e.weight > 0
        }
        if not served:
            return FairnessView()
        weights = {t: self._tenants[t].weight for t in served}
        table = shares(served, weights)
        return FairnessView(
            served_share={s.tenant: s.share for s in table},
            entitled_share={s.tenant: s.entitled for s in table},
            jain=jain_fairness(served, weights) if len(served) > 1 else 1.0,
        )
