"""Pacing the prefills of lent slots (issue #34: the flood's tail under lending).

Lending idle slots (:mod:`.takeback`) keeps an engine at full batch: whenever a slot frees
and no one under their share waits, a flooder's new request takes it, and its prompt's
prefill stretches the engine step that every request on that engine waits through, a
well-behaved arrival's included. No victim choice removes that: a victim is chosen only
when a well-behaved request finds no free slot, after the lent prefill ran.

:class:`PrefillPacer` estimates, per endpoint, until when the prefills sent there are under
way: each request sent adds its prompt's estimated tokens over ``prefill_tps`` seconds
(:attr:`~.grant.Ticket.prefill`), queued after the prefills before it on that endpoint (a
resumed request counts its prompt plus what it generated). The estimate, not the ticket's
``input_tokens``: without a tokenizer the gateway counts a prompt by its bytes, an upper
bound about 4x the tokens, and paced by it a pool paced at 2,500 tokens/s paced at about 600
and lent almost nothing (the harness, issue #34: 0.57 of FCFS's tokens/s, below the flood
limit alone). A *lent* slot (one the headroom gate would hold back, :mod:`.holdings`) goes to
an endpoint only once the estimate there has run out, so lent prefills are spaced out, one
at a time per endpoint, and never start on top of another request's prefill; requests within
their tenant's limit are never held (their prefills only extend the estimate).

``prefill_tps`` is the pool policy ``pace_prefill_tps`` (0, the default: no pacing): set
below an engine's real prefill rate, it also caps the lent prefills at that many tokens per
second per endpoint. Measured in virtual time (``python -m bench.preempt_sweep``,
contention, 8 seeds, engines prefilling 5,000 tokens/s): 2,500 lowered the well-behaved
tenants' mean worst p95 over baseline from 2.19 to 1.89 at the same tokens/s (96 % of
FCFS's); 1,500 cut tokens/s to 71-84 % of FCFS's; 10,000 paced too little (2.29).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from runtime.scheduling.interfaces import QueuedRequest
from runtime.scheduling.lent_prefill import LentPrefillRule
from runtime.snapshot import EndpointSnap


class PrefillPacer:
    """Per endpoint, the estimated end of the prefills sent there (module docstring); with
    :mod:`.lent_prefill`'s rules, also of the lent ones and of the others apart."""

    __slots__ = ("_busy", "_lent", "_others", "exclusive", "prefill_tps")

    def __init__(self, prefill_tps: float = 0.0, *, exclusive: bool = False) -> None:
        if not 0 <= prefill_tps < float("inf"):
            raise ValueError(f"prefill_tps must be >= 0 and finite, got {prefill_tps!r}")
        self.prefill_tps = prefill_tps
        self.exclusive = exclusive  # a lent slot waits for the others' prefills alone
        self._busy: dict[int, float] = {}  # endpoint id -> estimated end of its prefills
        self._lent: dict[int, float] = {}  # ... of its lent prefills
        self._others: dict[int, float] = {}  # ... of its prefills within their limit

    @property
    def on(self) -> bool:
        return self.prefill_tps > 0

    def _blocking(self) -> dict[int, float]:
        return self._others if self.exclusive else self._busy

    def allowed(self, endpoints: Sequence[EndpointSnap], now: float) -> list[EndpointSnap]:
        """The endpoints a lent slot may go to now: those with no estimated prefill under
        way (with ``exclusive``: no prefill within its limit; all of them without pacing)."""
        if not self.on:
            return list(endpoints)
        busy = self._blocking()
        return [e for e in endpoints if busy.get(e.id, 0.0) <= now]

    def sent(self, endpoint_id: int, prompt_tokens: int, now: float, *, lent: bool = False) -> None:
        """A request of ``prompt_tokens`` went to ``endpoint_id`` (``lent`` or not)."""
        if self.on:
            seconds = max(prompt_tokens, 0) / self.prefill_tps
            for track in (self._busy, self._lent if lent else self._others):
                track[endpoint_id] = max(track.get(endpoint_id, 0.0), now) + seconds

    def lent_until(self, endpoint_id: int) -> float:
        """The estimated end of the lent prefills sent to ``endpoint_id`` (0: none yet)."""
        return self._lent.get(endpoint_id, 0.0)

    def next_clear(self, now: float) -> float | None:
        """The earliest estimated end after ``now`` (when a lent slot may go); None."""
        return min((t for t in self._blocking().values() if t > now), default=None)


class PacedRoom:
    """One pump round's room for a lent slot: a queued request with room whose tenant the
    gate names goes only to an endpoint the pacer allows, and only when its estimated
    prefill fits the rule's bound (:meth:`__call__` is the pop's predicate; :meth:`of` the
    endpoints it found, steered by the rule for a request within its limit)."""

    __slots__ = ("_gated", "_has_room", "_now", "_of", "_pacer", "_prefill_of", "_rule", "_to")

    def __init__(
        self,
        pacer: PrefillPacer,
        has_room: Callable[[QueuedRequest], bool],
        of: Callable[[QueuedRequest], list[EndpointSnap]],
        gated: Collection[str],
        now: float,
        *,
        rule: LentPrefillRule | None = None,
        prefill_of: Callable[[QueuedRequest], int] | None = None,
    ) -> None:
        self._pacer, self._has_room, self._of = pacer, has_room, of
        self._gated, self._now = gated, now
        self._rule, self._prefill_of = rule or LentPrefillRule(), prefill_of
        self._to: dict[str, list[EndpointSnap]] = {}

    @property
    def deep(self) -> bool:
        """Whether the pop should look past a tenant's head (a bound on lent prompts)."""
        return self._rule.max_tokens > 0

    def __call__(self, req: QueuedRequest) -> bool:
        if not self._has_room(req):
            return False
        if req.tenant not in self._gated:
            return True
        prefill = 0 if self._prefill_of is None else self._prefill_of(req)
        if not self._rule.admits(req, prefill, self._now):
            return False
        self._to[req.id] = self._pacer.allowed(self._of(req), self._now)
        return bool(self._to[req.id])

    def lent(self, req: QueuedRequest) -> bool:
        """Whether ``req`` (popped with this round's predicates) takes a lent slot."""
        return req.id in self._to

    def of(self, req: QueuedRequest) -> list[EndpointSnap]:
        """Where ``req`` (popped with this round's predicates) may go."""
        to = self._to.get(req.id)
        if to is not None:
            return to
        return self._rule.steered(self._pacer, self._of(req), self._now)
