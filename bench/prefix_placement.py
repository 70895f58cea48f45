"""Prefix-aware placement for ``bench.dispatch_sim``: the router's index and rule, offline.

:class:`PrefixFleet` is a :class:`~runtime.testing.fleet.HandFleet` whose ``choose`` does what
the router will do once the request path computes a prompt's blocks (issue #35's wiring):

1. match the request's router-side block hashes (:mod:`runtime.routing.prefix`, 256-character
   blocks of the rendered chat) against the :class:`~runtime.routing.prefix_index.PrefixIndex`;
2. apply the sticky-until-saturated rule (:func:`runtime.routing.sticky.sticky_choice`) with,
   per endpoint, the cached tokens that match implies and the uncached prefill the router has
   sent there that has no first token yet;
3. if it names no endpoint, fall back to load (the least in flight over capacity, as
   ``HandFleet``);
4. record the request's blocks for the chosen endpoint and its estimated uncached prefill.

The dispatcher only passes ``affinity_key`` to ``choose``, so the simulation sets each
ticket's key to the request's index and registers its hashes with :meth:`expect` before the
ticket is queued. ``mode="load"`` keeps ``HandFleet``'s choice (load only) while still
recording, so both runs see the same bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from runtime.routing.prefix import CHARS_PER_TOKEN, DEFAULT_BLOCK_CHARS
from runtime.routing.prefix_index import PrefixIndex
from runtime.routing.sticky import Candidate, StickyRule, sticky_choice
from runtime.snapshot import EndpointSnap
from runtime.testing.fleet import HandFleet

Mode = Literal["load", "prefix"]
BLOCK_TOKENS = DEFAULT_BLOCK_CHARS // CHARS_PER_TOKEN


class PrefixFleet(HandFleet):
    """A hand fleet that places by the longest cached prefix until saturated (see module)."""

    def __init__(
        self,
        *,
        mode: Mode,
        now: Callable[[], float],
        rule: StickyRule | None = None,
        index: PrefixIndex | None = None,
    ) -> None:
        super().__init__()
        self.mode = mode
        self.rule = rule or StickyRule()
        self.index = index or PrefixIndex()
        self._now = now  # a zero-argument callable: the simulation's clock
        self._expected: dict[str, tuple[tuple[int, ...], int]] = {}
        self.queued: dict[int, dict[str, int]] = {}  # endpoint -> key -> uncached tokens
        self.sticky = 0
        self.by_load = 0

    def expect(self, key: str, hashes: tuple[int, ...], prompt_tokens: int) -> None:
        """The request with affinity key ``key`` has these router-side block hashes."""
        self._expected[key] = (hashes, prompt_tokens)

    def started(self, endpoint_id: int, key: str) -> None:
        """Its first token came: its prefill is no longer queued."""
        self.queued.get(endpoint_id, {}).pop(key, None)

    def choose(
        self,
        endpoints: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        adapter: str | None = None,
    ) -> EndpointSnap:
        expected = self._expected.pop(affinity_key, None) if affinity_key else None
        if expected is None:
            return super().choose(endpoints, affinity_key, adapter=adapter)
        hashes, prompt_tokens = expected
        now = self._now()
        matched = self.index.match(hashes, now, [e.id for e in endpoints])
        chosen: EndpointSnap | None = None
        if self.mode == "prefix":
            candidates = [
                Candidate(
                    endpoint_id=e.id,
                    cached_tokens=matched.get(e.id, 0) * BLOCK_TOKENS,
                    queued_prefill_tokens=sum(self.queued.get(e.id, {}).values()),
                    in_flight=self.inflight.get(e.id, 0),
                    capacity=e.capacity,
                )
                for e in endpoints
            ]
            sticky = sticky_choice(candidates, self.rule)
            chosen = next((e for e in endpoints if e.id == sticky), None)
        if chosen is None:
            chosen = super().choose(endpoints, affinity_key)
            self.by_load += 1
        else:
            self.sticky += 1
        uncached = max(0, prompt_tokens - matched.get(chosen.id, 0) * BLOCK_TOKENS)
        if affinity_key is not None:
            self.queued.setdefault(chosen.id, {})[affinity_key] = uncached
        self.index.record(chosen.id, hashes, now)
        return chosen
