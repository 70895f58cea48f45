"""Prefix-aware placement: the router's prefix index, its queued prefill and the sticky rule.

One :class:`PrefixPlacer` per router process (endpoint ids are unique across pools), shared
by every pool's :class:`~runtime.scheduling.placement.FleetPlacement` and the ``prefix``
stages (:mod:`runtime.gateway.pipeline.stages.prefix`). For a request that carries a
:class:`~runtime.routing.prefix.PromptPrefix` (its prompt's block hashes):

1. :meth:`PrefixPlacer.match` — per endpoint, how many of its leading blocks the endpoint is
   believed to hold (:class:`~runtime.routing.prefix_index.PrefixIndex`);
2. :meth:`PrefixPlacer.sticky` — the endpoint the sticky-until-saturated rule
   (:func:`~runtime.routing.sticky.sticky_choice`; the pool's parameters where the request
   carries them, ``PromptPrefix.rule``, else the placer's) keeps it on, among those with
   room, or ``None`` to let the pool's scorers route by load;
3. :meth:`PrefixPlacer.sent` — at dispatch: the chosen endpoint will cache the prompt's blocks
   (the index learns them) and must first prefill its uncached tokens (counted as queued
   prefill there until :meth:`PrefixPlacer.started`: the first byte came, or the request ended).

While the endpoint holding the request's prefix is full, :meth:`PrefixPlacer.room` may keep it
waiting for a slot there (the hold of :func:`~runtime.routing.sticky.prefix_hold`): the
dispatcher asks it which endpoints with room the request may take now. The hold's clock starts
the first time the placer is asked for the request (an endpoint had room for it, another was
full), not at its arrival: past capacity a request waits in the queue for seconds before any
endpoint has room, and it still holds for the one with its prefix then (the "sticky while
saturated" rule of :mod:`runtime.routing.sticky`).

Queued prefill is the router's own estimate, tokens as ``PromptPrefix.uncached_tokens`` (4
characters a token), per endpoint; it is a sum over this process's streamed requests only (a
unary request's first byte is its whole answer, which says nothing of when its prefill ended:
``PromptPrefix.queues``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from runtime.routing.prefix import CHARS_PER_TOKEN, PrefixMatch, PromptPrefix
from runtime.routing.prefix_index import PrefixIndex
from runtime.routing.sticky import Candidate, StickyRule, prefix_hold, sticky_choice
from runtime.snapshot import EndpointSnap

# Requests whose hold's start the placer keeps (each is forgotten at its dispatch or end: this
# only bounds requests that leave without either, the oldest dropped first).
MAX_ASKED: Final = 65_536


class PrefixPlacer:
    """The index, the queued prefill per endpoint and the rule (see the module docstring)."""

    __slots__ = (
        "_asked", "_clock", "_queued", "_where", "by_load", "index", "rule", "sticky_count",
    )  # fmt: skip

    def __init__(
        self,
        *,
        index: PrefixIndex | None = None,
        rule: StickyRule | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index if index is not None else PrefixIndex()
        self.rule = rule if rule is not None else StickyRule()
        self._clock = clock
        self._queued: dict[int, dict[PromptPrefix, int]] = {}  # endpoint -> request -> tokens
        self._where: dict[PromptPrefix, int] = {}  # request -> endpoint it waits on
        self._asked: dict[PromptPrefix, float] = {}  # request -> when room was first asked
        self.sticky_count = 0  # placements the rule made
        self.by_load = 0  # placements left to the pool's scorers

    def match(self, prefix: PromptPrefix, endpoints: Sequence[EndpointSnap]) -> PrefixMatch:
        """The request's blocks held by each of ``endpoints``."""
        matched = self.index.match(prefix.hashes, self._clock(), [e.id for e in endpoints])
        return PrefixMatch(
            blocks=len(prefix.hashes), matched=matched, block_chars=prefix.block_chars,
            rule=prefix.rule,
        )  # fmt: skip

    def queued_prefill(self, endpoint_id: int) -> int:
        """Uncached prompt tokens sent to the endpoint that have no first byte yet."""
        queued = self._queued.get(endpoint_id)
        return 0 if not queued else sum(queued.values())

    def sticky(
        self,
        endpoints: Sequence[EndpointSnap],
        match: PrefixMatch,
        inflight: Callable[[int], int],
    ) -> EndpointSnap | None:
        """The endpoint the rule keeps the request on, or None: route by load."""
        rule = match.rule or self.rule
        most = max(match.matched.values(), default=0) * match.block_chars // CHARS_PER_TOKEN
        if most < rule.min_saved_tokens:  # the rule names none: skip building its candidates
            self.by_load += 1
            return None
        candidates = [
            Candidate(
                endpoint_id=e.id,
                cached_tokens=match.cached_tokens(e.id),
                queued_prefill_tokens=self.queued_prefill(e.id),
                in_flight=inflight(e.id),
                capacity=e.capacity,
            )
            for e in endpoints
        ]
        chosen = sticky_choice(candidates, rule)
        found = next((e for e in endpoints if e.id == chosen), None)
        if found is None:
            self.by_load += 1
        else:
            self.sticky_count += 1
        return found

    def room(
        self,
        prefix: PromptPrefix,
        roomy: Sequence[EndpointSnap],
        candidates: Sequence[EndpointSnap],
        *,
        waited_s: float,
    ) -> Sequence[EndpointSnap]:
        """Those of ``roomy`` (the ``candidates`` with room) the request may take now: none
        while it holds for a full endpoint (:func:`~runtime.routing.sticky.prefix_hold`),
        else all of them. The hold runs from the first time the placer is asked for this
        request (module docstring), never longer than ``waited_s`` (its time in the queue)."""
        rule = prefix.rule or self.rule
        if not roomy or len(roomy) >= len(candidates) or rule.hold_ms <= 0:
            return roomy  # nothing full, or holding is off: no lookup
        now = self._clock()
        asked = self._asked.setdefault(prefix, now)
        if len(self._asked) > MAX_ASKED:
            del self._asked[next(iter(self._asked))]
        held_s = min(waited_s, now - asked)
        if held_s * 1000.0 >= rule.hold_ms:
            return roomy  # it has held long enough: no lookup
        matched = self.index.match(prefix.hashes, now, [e.id for e in candidates])
        if not matched:
            return roomy
        room_ids = {e.id for e in roomy}
        best_room = max((matched.get(i, 0) for i in room_ids), default=0)
        best_full = max((n for i, n in matched.items() if i not in room_ids), default=0)
        chars = prefix.block_chars
        full, room = best_full * chars // CHARS_PER_TOKEN, best_room * chars // CHARS_PER_TOKEN
        if prefix_hold(full, room, held_s, rule):
            return ()
        return roomy

    def sent(self, endpoint_id: int, prefix: PromptPrefix, match: PrefixMatch) -> None:
        """The request goes to ``endpoint_id``: learn its blocks there, queue its prefill."""
        if prefix in self._where or prefix in self._asked:
            self.started(prefix)  # a retry moves it
        self.index.record(endpoint_id, prefix.hashes, self._clock())
        uncached = prefix.uncached_tokens(match.matched.get(endpoint_id, 0))
        if uncached > 0 and prefix.queues:
            self._queued.setdefault(endpoint_id, {})[prefix] = uncached
            self._where[prefix] = endpoint_id

    def retain(self, endpoint_ids: Iterable[int]) -> None:
        """Forget the index of endpoints not in ``endpoint_ids`` (the snapshot's)."""
        self.index.retain(endpoint_ids)

    def started(self, prefix: PromptPrefix) -> None:
        """The request's prefill is done (first byte) or will never run (it ended):
        idempotent."""
        self._asked.pop(prefix, None)
        endpoint_id = self._where.pop(prefix, None)
        if endpoint_id is None:
            return
        queued = self._queued.get(endpoint_id)
        if queued is not None:
            queued.pop(prefix, None)
            if not queued:
                del self._queued[endpoint_id]
