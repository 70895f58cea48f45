"""What each tenant holds and asks for in one pool, and the headroom gate over it.

:class:`Holdings` keeps, per tenant, the slots it holds (requests in flight), the requests it
has waiting and the weight of those, and judges them with the pool's
:class:`~.headroom.HeadroomRule`: who is held back (:meth:`Holdings.gate`), each tenant's
share (:meth:`Holdings.shares`), whether a tenant already holds its weighted part of the
queue's bound (:meth:`Holdings.over_quota`), and lending's terms: the flood limit may lend a
slot the gate would hold back while more than ``lend_reserve`` of the pool's slots are free
(:meth:`Holdings.lendable`); the lent slots are taken back by preemption
(:mod:`.takeback`). The dispatcher (:mod:`.dispatcher`) tells it every change.
"""

from __future__ import annotations

from collections import Counter

from runtime.scheduling.headroom import Gate, HeadroomRule


class Holdings:
    """Slots held and asked for, per tenant, and the gate over them (module docstring)."""

    __slots__ = ("inflight", "lend", "lend_reserve", "queued", "rule", "weights")

    def __init__(self, rule: HeadroomRule, *, lend: bool, lend_reserve: int) -> None:
        if lend_reserve < 0:
            raise ValueError(f"lend_reserve must be >= 0, got {lend_reserve!r}")
        self.rule = rule
        self.lend = lend
        self.lend_reserve = lend_reserve
        self.inflight: Counter[str] = Counter()
        self.queued: Counter[str] = Counter()  # tenant -> requests waiting
        self.weights: dict[str, float] = {}  # weights of the tenants with requests waiting

    # -- changes ------------------------------------------------------------------------

    def took(self, tenant: str) -> None:
        """``tenant`` took a slot."""
        self.inflight[tenant] += 1

    def gave(self, tenant: str) -> None:
        """``tenant`` gave a slot back."""
        self.inflight[tenant] -= 1
        if self.inflight[tenant] <= 0:
            del self.inflight[tenant]

    def waits(self, tenant: str, weight: float) -> None:
        """A request of ``tenant`` (of ``weight``) waits in the queue."""
        self.queued[tenant] += 1
        self.weights[tenant] = weight

    def left(self, tenant: str) -> None:
        """A waiting request of ``tenant`` left the queue."""
        self.queued[tenant] -= 1
        if self.queued[tenant] <= 0:
            del self.queued[tenant]
            self.weights.pop(tenant, None)

    def note(self, tenant: str, weight: float, now: float) -> None:
        """``tenant`` was just admitted into the pool (the rule's activity window)."""
        self.rule.note(tenant, weight, now)

    # -- judgments ----------------------------------------------------------------------

    def gate(self, capacity: int, now: float, *, arriving: str | None = None) -> Gate:
        """The headroom gate now; ``arriving``: judged as if only that tenant's one request
        waited (the fast path, with nothing queued)."""
        queued = self.queued if arriving is None else {arriving: 1}
        return self.rule.gate(inflight=self.inflight, queued=queued, capacity=capacity, now=now)

    def blocks(self, gate: Gate, tenant: str) -> bool:
        """Whether ``gate`` holds ``tenant`` back (its lent slots not counted when lending)."""
        return gate.blocks(tenant, self.inflight, lending=self.lend)

    def all_blocked(self, gate: Gate) -> bool:
        """Every tenant the gate names is held back."""
        return bool(gate) and all(self.blocks(gate, t) for t in gate.tenants)

    def lendable(self, capacity: int) -> bool:
        """Whether a slot may be lent now: lending is on and more than ``lend_reserve`` of
        the pool's ``capacity`` slots are free."""
        return self.lend and capacity - sum(self.inflight.values()) > self.lend_reserve

    def shares(self, capacity: int, now: float) -> dict[str, float]:
        """Each active tenant's share of the pool's slots now (:meth:`.HeadroomRule.shares`)."""
        return self.rule.shares(
            inflight=self.inflight, queued=self.queued, capacity=capacity, now=now
        )

    def over_quota(self, tenant: str, weight: float, bound: int | None) -> bool:
        """``tenant`` already holds its weighted share of the pool queue's ``bound``."""
        if bound is None:
            return False
        mine = self.queued.get(tenant, 0)
        if mine == 0:
            return False
        others = sum(w for t, w in self.weights.items() if t != tenant)
        return mine >= bound * weight / (others + weight)
