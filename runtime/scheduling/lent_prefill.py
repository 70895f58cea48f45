"""Where and which lent prefills may go: rules that keep the flooder's prefills out of the
well-behaved requests' engine steps (issue #34, work-conserving isolation).

The oracle bounds (``python -m bench.preempt_bound``) say where the well-behaved tenants'
tail under lending lies: engines that run the flooder's prefills only in steps without a
well-behaved prefill, at most 128 tokens a step, meet the goals on 7 of 8 seeds where the
router's best rule meets them on none. The router cannot chunk a prefill, but it decides
when a lent request goes to an endpoint, which one, and which prompt it lends; these rules
approximate the oracle with what the dispatcher knows, its prefill estimate per endpoint
(:class:`~.pacing.PrefillPacer`, the pool policy ``pace_prefill_tps``):

- ``lend_max_prefill`` (tokens, 0: no bound): a lent slot goes only to a new request whose
  estimated prefill is at most this (a preempted request resuming is not bounded: it keeps
  its place, and a bound would stretch its pause; measured in virtual time, exempting
  resumes cut the pause's p95 about fivefold at the same tail); the lent pop takes the
  tenant's first such request in its order, so a long prompt waits for a slot within its
  tenant's limit without holding the short ones back, until it has waited half the time
  to its deadline (then it may be lent as well: the bound defers, it never expires one);
- ``lend_exclusive`` (``on``/``off``): a lent slot waits only for the estimated prefills
  of requests within their limit on that endpoint, not for other lent ones (the pacer's
  default waits for every prefill);
- ``lend_steer`` (``on``/``off``): a request within its tenant's limit goes, among the
  endpoints with room, to those with no lent prefill estimated under way, else to those
  whose lent prefills end soonest.

All need ``pace_prefill_tps`` for the estimate but ``lend_max_prefill``; all are off by
default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.scheduling.interfaces import QueuedRequest
    from runtime.scheduling.pacing import PrefillPacer
    from runtime.snapshot import EndpointSnap


@dataclass(frozen=True, slots=True)
class LentPrefillRule:
    """The pool's lent-prefill rules (module docstring)."""

    max_tokens: int = 0
    exclusive: bool = False
    steer: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens!r}")

    def fits(self, prefill_tokens: int) -> bool:
        """Whether a prompt of ``prefill_tokens`` estimated tokens may take a lent slot."""
        return not self.max_tokens or prefill_tokens <= self.max_tokens

    def admits(self, req: QueuedRequest, prefill_tokens: int, now: float) -> bool:
        """Whether queued ``req`` may take a lent slot now: its prompt fits, or it has
        waited half the time from its arrival to its deadline (a long prompt is not left
        to expire behind the short ones)."""
        if self.fits(prefill_tokens):
            return True
        return now - req.arrived_at >= (req.deadline - req.arrived_at) / 2

    def steered(
        self, pacer: PrefillPacer, endpoints: Sequence[EndpointSnap], now: float
    ) -> list[EndpointSnap]:
        """Where a request within its limit may go of ``endpoints`` (with room): all of them
        without ``steer``, else those whose lent prefills end soonest (module docstring)."""
        if not self.steer or not pacer.on or len(endpoints) < 2:
            return list(endpoints)
        ends = {e.id: max(pacer.lent_until(e.id), now) for e in endpoints}
        soonest = min(ends.values())
        return [e for e in endpoints if ends[e.id] <= soonest]
