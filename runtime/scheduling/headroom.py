"""Headroom: part of a pool's slots is kept for the tenants below their share.

Fair *order* is not fair *latency*. With a tenant flooding a pool, every in-flight slot holds
one of its requests; a light tenant's request goes first by its fairness counter, but it still
waits for a slot to free up — up to a whole generation, and then for the engine's next step.
So, for fairness policies that isolate tenants (``isolates_tenants``), the dispatcher keeps a
reserve of slots that only tenants below their share may take, and holds a flooding tenant to
what the others left free at their recent peak. The rule, precisely:

- *active* tenants: those with a request queued or in flight in the pool, or admitted into it
  within the last ``window_s`` seconds;
- a tenant's *share* of slots: the pool's capacity ``C`` (summed over its usable endpoints)
  times its weight over the active tenants' total weight;
- its *usage*: the slots it held in flight, averaged exponentially with time constant
  ``window_s``; its *demand*: the slots it held or asked for (in flight + queued), averaged
  with time constant ``window_s * DEMAND_TIME``; both start at its share when it is first seen;
- its *recent peak*: the most it held and asked for at once within the last one to two
  ``window_s * PEAK_MEMORY`` (a sliding maximum kept in two buckets);
- *flooders*: tenants whose demand exceeds ``FLOOD_DEMAND`` shares. Together they may hold at
  most ``C`` minus the other tenants' recent peaks added up, and never less than
  ``FLOOD_FLOOR`` of their shares; they are over (below) whatever they hold;
- its *credit*: ``min(share * BURST_CAP, BURST_GAIN * (share - usage))`` slots while its usage
  is below its share, else none;
- *over* tenants hold more than their share plus their credit in flight, or flood; the others
  are *under*. Over tenants yield to the under ones whatever the band (the dispatcher pops an
  under tenant's request first);
- the reserve ``R`` adds up, over the under tenants whose usage is at most their share, each
  one's recent peak capped at its share; it is at least ``floor(C * fraction)`` and at most
  the under tenants' shares added up (so the over tenants keep at least their own shares);
- the over tenants together may hold at most ``C - R`` slots, the flooders at most their own
  limit as well (:class:`Gate`). With no under tenant, no over tenant, or only flooders,
  nothing is gated.

Why each part, measured (``python -m bench.dispatch_sim``, over several ``--seed`` schedules,
and the contention scenario's per-request trace, router log at ``info``):

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
  share is not kept room at the expense of those it squeezed;
- the flood limit: generations cannot be preempted, so what a burst finds free is what the
  flooders did not take *before* it. Held to its share, a flooder kept 8-9 of 32 slots in
  long generations and the others' bursts (wanting about 29) queued: the well-behaved
  tenants' p95 was 3.7-6x their no-flood baseline. Held to what the others' recent peak
  leaves, it is 0.8-1.9x on most schedules. Judged by its demand, not its usage: usage
  follows whatever limit it is held to (an allowance from usage converges back to the
  share), while a flooder's queue keeps its demand high; a well-behaved tenant's 2-s burst
  moves its demand average by a fraction of a share. The peak memory spans the gaps between
  bursts (10 s in the scenario); a shorter one let the flooder refill just before the next;
- the reserve uses the recent peak too: at a flood's onset (before its demand average has
  risen) the over tenants' limit is what keeps room for the others' next burst.

The price, paid only while a tenant over its share (or flooding) and one under it coexist:
slots idle. The reserve idles while nobody below its share needs it (bounded by the under
tenants' shares); a flooder waits while up to the others' recent peak stays free, so it gets
the pool's leftover at their peak, not its share, until their peak leaves the memory. A flood
that starts into an idle pool takes the free slots until its demand average crosses the
threshold (a second or two); those generations hold their slots to the end. When only one
tenant is active its share is the whole pool: nothing is gated or wasted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

BURST_GAIN = 4.0  # slots of credit per slot of its share a tenant left unused on average
BURST_CAP = 0.5  # the most credit, in shares
FLOOD_DEMAND = 2.0  # shares asked for, on average, past which a tenant floods
FLOOD_FLOOR = 0.25  # the least the flooding tenants may hold, in shares
DEMAND_TIME = 0.5  # the demand's averaging time constant, in windows
PEAK_MEMORY = 3.0  # how long a peak demand is remembered (between one and two of these), in windows


@dataclass(frozen=True, slots=True)
class Gate:
    """Who yields, and the slots the gated tenants may hold.

    ``tenants`` (over their share, flooders included) yield to the others and together hold
    at most ``limit`` slots; ``flooders`` together hold at most ``flood_limit`` as well.
    """

    tenants: frozenset[str] = frozenset()
    limit: int = 0
    flooders: frozenset[str] = frozenset()
    flood_limit: int = 0

    def __bool__(self) -> bool:
        return bool(self.tenants)

    def blocks(self, tenant: str, inflight: Mapping[str, int], *, lending: bool = False) -> bool:
        """Whether ``tenant``, holding what ``inflight`` says, may not take one more slot.

        ``lending``: the flooders' slots past their limit are lent (taken back by preemption,
        :mod:`.preempt`), so they count at most ``flood_limit`` against the others' limit."""
        flooded = sum(inflight.get(t, 0) for t in self.flooders)
        if tenant in self.tenants:
            held = sum(inflight.get(t, 0) for t in self.tenants)
            if lending and flooded > self.flood_limit:
                held -= flooded - self.flood_limit
            if held >= self.limit:
                return True
        return tenant in self.flooders and flooded >= self.flood_limit

    def lent(self, inflight: Mapping[str, int]) -> frozenset[str]:
        """The tenants holding slots lent past their limit: the flooders past theirs, else
        the gated tenants past theirs."""
        if self.flooders and sum(inflight.get(t, 0) for t in self.flooders) > self.flood_limit:
            return self.flooders
        if self.tenants and sum(inflight.get(t, 0) for t in self.tenants) > self.limit:
            return self.tenants
        return frozenset()


OPEN = Gate()


@dataclass(slots=True)
class _Seen:
    """What the rule remembers of one tenant."""

    weight: float
    last: float  # last admission
    usage: float = math.nan  # slots held, averaged over about window_s; nan until first seen
    demand: float = math.nan  # slots held or asked for, averaged over DEMAND_TIME windows
    held: int = 0  # slots held at the last look
    wanted: int = 0  # slots held or asked for at the last look
    seen_at: float = 0.0
    peak: int = 0  # the most it held and asked for at once, since peak_since
    peak_since: float = -math.inf
    last_peak: int = 0  # the same over the PEAK_MEMORY windows before peak_since

    def observe(
        self,
        held: int,
        wanted: int,
        share: float,
        now: float,
        *,
        decays: tuple[float, float],
        memory: float,
    ) -> None:
        """Bring the averages up to ``now`` (what was noted last held since then; ``decays``:
        the usage's and the demand's ``exp(-elapsed / time constant)`` for the time since),
        note ``held`` and ``wanted``, and keep the peak in two buckets of ``memory`` seconds
        (a sliding maximum without a cliff). A tenant first seen starts at ``share``."""
        if math.isnan(self.usage):
            self.usage = self.demand = share
        else:
            usage_decay, demand_decay = decays
            self.usage = self.held + (self.usage - self.held) * usage_decay
            self.demand = self.wanted + (self.demand - self.wanted) * demand_decay
        self.held, self.wanted, self.seen_at = held, wanted, now
        if now - self.peak_since >= memory:
            self.last_peak = self.peak if now - self.peak_since < 2 * memory else 0
            self.peak, self.peak_since = wanted, now
        elif wanted > self.peak:
            self.peak = wanted

    @property
    def recent_peak(self) -> int:
        """Its peak demand within the last one to two PEAK_MEMORY windows."""
        return max(self.peak, self.last_peak)


class HeadroomRule:
    """The rule above, with the per-tenant state it needs (weights, averages, peaks)."""

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

    def _active(
        self, inflight: Mapping[str, int], queued: Mapping[str, int], now: float
    ) -> tuple[list[tuple[str, _Seen]], float]:
        """The active tenants and their total weight; those idle a whole window forgotten."""
        horizon = now - self.window_s
        active: list[tuple[str, _Seen]] = []
        total = 0.0
        forget: list[str] = []
        for tenant, seen in self._seen.items():
            if seen.last >= horizon or inflight.get(tenant, 0) > 0 or queued.get(tenant, 0) > 0:
                active.append((tenant, seen))
                total += seen.weight
            else:
                forget.append(tenant)
        for tenant in forget:
            del self._seen[tenant]
        return active, total

    def shares(
        self, *, inflight: Mapping[str, int], queued: Mapping[str, int], capacity: int, now: float
    ) -> dict[str, float]:
        """Each active tenant's share of ``capacity`` slots, as :meth:`gate` counts it; a
        read: it changes nothing the rule remembers."""
        horizon = now - self.window_s
        active = {
            tenant: seen.weight
            for tenant, seen in self._seen.items()
            if seen.last >= horizon or inflight.get(tenant, 0) > 0 or queued.get(tenant, 0) > 0
        }
        total = sum(active.values())
        return {t: capacity * w / total for t, w in active.items()} if total > 0 else {}

    def gate(
        self,
        *,
        inflight: Mapping[str, int],
        queued: Mapping[str, int],
        capacity: int,
        now: float,
    ) -> Gate:
        """Who is gated right now, and the slots they may hold."""
        if self.fraction == 0 or capacity <= 0:
            return OPEN
        active, total = self._active(inflight, queued, now)
        over: list[str] = []
        flooders: list[str] = []
        under_share = reserve_need = flood_floor = 0.0
        others_peak = 0
        memory = self.window_s * PEAK_MEMORY
        decays: dict[float, tuple[float, float]] = {}  # by last look: seen together, decay together
        for tenant, seen in active:
            share = capacity * seen.weight / total
            held = inflight.get(tenant, 0)
            wanted = held + queued.get(tenant, 0)
            decay = decays.get(seen.seen_at)
            if decay is None:
                usage_decay = math.exp(min(seen.seen_at - now, 0.0) / self.window_s)
                decay = decays[seen.seen_at] = (usage_decay, usage_decay ** (1.0 / DEMAND_TIME))
            seen.observe(held, wanted, share, now, decays=decay, memory=memory)
            if seen.demand > FLOOD_DEMAND * share:
                flooders.append(tenant)
                over.append(tenant)
                flood_floor += share * FLOOD_FLOOR
                continue
            recent_peak = seen.recent_peak
            others_peak += recent_peak
            usage = seen.usage
            credit = min(share * BURST_CAP, BURST_GAIN * (share - usage)) if usage < share else 0.0
            if held > share + credit:
                over.append(tenant)
            else:
                under_share += share
                if usage <= share:  # room is kept for a tenant not above its share on average
                    reserve_need += min(recent_peak, share)
        limit = capacity
        if over and len(over) < len(active):
            reserve = max(math.ceil(reserve_need), math.floor(capacity * self.fraction))
            limit -= min(reserve, math.floor(under_share))
        if not flooders or len(flooders) == len(active):
            return Gate(frozenset(over), limit) if limit < capacity else OPEN
        flood_limit = max(capacity - others_peak, math.ceil(flood_floor))
        return Gate(frozenset(over), limit, frozenset(flooders), flood_limit)
