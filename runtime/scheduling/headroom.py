"""Headroom: part of a pool's slots is kept for the tenants below their share.

Fair *order* is not fair *latency*. With a tenant flooding a pool, every in-flight slot holds
one of its requests; a light tenant's request goes first by its fairness counter, but it still
waits for a slot to free up — up to a whole generation, and then for the engine's next step.
So, for fairness policies that isolate tenants (``isolates_tenants``), the dispatcher keeps a
reserve of slots that only tenants below their share may take. The rule, precisely:

- *active* tenants: those with a request queued or in flight in the pool, or admitted into it
  within the last ``window_s`` seconds;
- a tenant's *share* of slots: the pool's capacity ``C`` (summed over its usable endpoints)
  times its weight over the active tenants' total weight;
- a tenant's *usage*: the slots it held in flight, averaged exponentially with time constant
  ``window_s``. A tenant first seen starts at its share;
- its *credit*: ``min(share * BURST_CAP, BURST_GAIN * (share - usage))`` slots while its usage
  is below its share, else none;
- *over* tenants hold more than their share plus their credit in flight; the others are
  *under*. With no under tenant (or no over tenant) nothing is gated. Over tenants also
  yield to the under ones whatever the band (the dispatcher pops an under tenant's request
  first);
- the reserve ``R`` adds up, over the under tenants whose usage is at most their share, each
  one's peak demand (in flight + queued) within the last ``window_s``, capped at its share; it
  is at least ``floor(C * fraction)`` and at most the under tenants' shares added up (so the
  over tenants keep at least their own shares);
- the over tenants together may hold at most ``C - R`` slots (:class:`Gate`).

Why each part, measured (``python -m bench.dispatch_sim`` and the contention scenario's
per-request trace, router log at ``info``):

- a tenant holding exactly its share is under: counted as over, a well-behaved tenant at its
  share during a burst was gated together with a flooder past it (one group limit) and waited
  for the flooder's excess to drain;
- the credit: a well-behaved tenant bursting past an equal split was gated together with the
  flooder, and the freed slots went to the flooder, which the burst had pushed just under its
  share. On the quiet machine, before the credit, that wait was the well-behaved tenants'
  whole flood tail (their queue p95 0.6-2.9 s; the engines' time unchanged). The credit is
  capped and shrinks as the average catches up, so a tenant that turns into a flooder gets
  at most ``1 + BURST_CAP`` shares, for a few seconds;
- the yield across bands: with the flooder's interactive requests (band 0) ahead of
  everyone's batch (band 2), the well-behaved tenants' batch streams waited behind a tenant
  past its share;
- the reserve skips a tenant above its share on average: a flooder squeezed just under its
  share is not kept room at the expense of those it squeezed.

The reserve idles while nobody below its share needs it: that is the price (bounded by the
under tenants' shares, and paid only while a tenant over its share and one under it coexist).
When only one tenant is active its share is the whole pool: nothing is gated or wasted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

BURST_GAIN = 4.0  # slots of credit per slot of its share a tenant left unused on average
BURST_CAP = 0.5  # the most credit, in shares


@dataclass(frozen=True, slots=True)
class Gate:
    """Tenants over their share, and how many slots they may hold together."""

    tenants: frozenset[str] = frozenset()
    limit: int = 0

    def __bool__(self) -> bool:
        return bool(self.tenants)


OPEN = Gate()


@dataclass(slots=True)
class _Seen:
    weight: float
    last: float  # last admission
    peak: int = 0  # the most it had queued and in flight at once, within the window
    peak_at: float = -math.inf
    usage: float = math.nan  # slots held, averaged over about window_s; nan until first seen
    held: int = 0  # slots held at the last look
    held_at: float = 0.0

    def average(self, held: int, share: float, now: float, window_s: float) -> float:
        """The usage, brought up to ``now`` (``self.held`` was held since the last look),
        then ``held`` noted. A tenant seen for the first time starts at ``share``."""
        if math.isnan(self.usage):
            self.usage = share
        elif now > self.held_at:
            decay = math.exp((self.held_at - now) / window_s)
            self.usage = self.held + (self.usage - self.held) * decay
        self.held, self.held_at = held, now
        return self.usage


class HeadroomRule:
    """The rule above, with the per-tenant state it needs (weights, last admission, peak)."""

    __slots__ = ("_seen", "fraction", "window_s")

    def __init__(self, *, fraction: float, window_s: float = 10.0) -> None:
        if not (math.isfinite(fraction) and 0 <= fraction < 1):
            raise ValueError(f"headroom fraction must be in [0, 1), got {fraction!r}")
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.fraction = fraction
        self.window_s = window_s
        self._seen: dict[str, _Seen] = {}

    def note(self, tenant: str, weight: float, now: float) -> None:
        """``tenant`` (of ``weight``) was just admitted into the pool."""
        seen = self._seen.get(tenant)
        if seen is None:
            self._seen[tenant] = _Seen(weight, now)
        else:
            seen.weight, seen.last = weight, now

    def gate(
        self,
        *,
        inflight: Mapping[str, int],
        queued: Mapping[str, int],
        capacity: int,
        now: float,
    ) -> Gate:
        """Who is gated right now, and the slots they may hold together."""
        if self.fraction == 0 or capacity <= 0:
            return OPEN
        horizon = now - self.window_s
        active: dict[str, float] = {}
        for tenant in list(self._seen):
            seen = self._seen[tenant]
            if seen.last >= horizon or inflight.get(tenant, 0) > 0 or queued.get(tenant, 0) > 0:
                active[tenant] = seen.weight
            else:
                del self._seen[tenant]  # idle for a whole window: forget it
        total = sum(active.values())
        over: list[str] = []
        under_share = 0.0
        reserve_need = 0.0
        for tenant, weight in active.items():
            share = capacity * weight / total
            seen = self._seen[tenant]
            demand = inflight.get(tenant, 0) + queued.get(tenant, 0)
            if demand >= seen.peak or now - seen.peak_at > self.window_s:
                seen.peak, seen.peak_at = demand, now
            held = inflight.get(tenant, 0)
            usage = seen.average(held, share, now, self.window_s)
            credit = min(share * BURST_CAP, BURST_GAIN * (share - usage)) if usage < share else 0.0
            if held > share + credit:
                over.append(tenant)
            else:
                under_share += share
                if usage <= share:  # room is kept for a tenant not above its share on average
                    reserve_need += min(seen.peak, share)
        if not over or len(over) == len(active):
            return OPEN
        reserve = max(math.ceil(reserve_need), math.floor(capacity * self.fraction))
        reserve = min(reserve, math.floor(under_share))
        return Gate(frozenset(over), max(capacity - reserve, 0))
