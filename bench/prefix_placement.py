"""Prefix-aware placement for ``bench.dispatch_sim``: the router's index and rule, offline.

:class:`PrefixFleet` is a :class:`~runtime.testing.fleet.HandFleet` whose ``choose`` does what
the router does (:class:`runtime.routing.prefix_placer.PrefixPlacer`, the same object):

1. match the request's router-side block hashes (:mod:`runtime.routing.prefix`, 256-character
   blocks of the rendered chat) against the :class:`~runtime.routing.prefix_index.PrefixIndex`;
2. apply the sticky-until-saturated rule (:func:`runtime.routing.sticky.sticky_choice`) with,
   per endpoint, the cached tokens that match implies and the uncached prefill the router has
   sent there that has no first token yet;
3. if it names no endpoint, fall back to load (the least in flight over capacity, as
   ``HandFleet``);
4. record the request's blocks for the chosen endpoint and its estimated uncached prefill;

and, while some endpoint is full, the dispatcher's room for a request is the placer's
(:meth:`PrefixFleet.prefix_room`): it may hold for a full endpoint holding its prefix.

The simulation sets each ticket's key to the request's index and registers its hashes with
:meth:`expect` before the ticket is queued (a ticket's own ``prefix`` is used when it has
one). ``mode="load"`` keeps ``HandFleet``'s choice (load only) while still recording, so both
runs see the same bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from runtime.routing.prefix import PromptPrefix
from runtime.routing.prefix_index import PrefixIndex
from runtime.routing.prefix_placer import PrefixPlacer
from runtime.routing.sticky import StickyRule
from runtime.snapshot import EndpointSnap
from runtime.testing.fleet import HandFleet

Mode = Literal["load", "prefix"]


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
        self.placer = PrefixPlacer(index=index, rule=rule, clock=now)
        self._expected: dict[str, PromptPrefix] = {}
        self._sent: dict[str, PromptPrefix] = {}

    @property
    def index(self) -> PrefixIndex:
        return self.placer.index

    @index.setter
    def index(self, index: PrefixIndex) -> None:
        self.placer.index = index

    @property
    def sticky(self) -> int:
        return self.placer.sticky_count

    @sticky.setter
    def sticky(self, count: int) -> None:
        self.placer.sticky_count = count

    @property
    def by_load(self) -> int:
        return self.placer.by_load

    @by_load.setter
    def by_load(self, count: int) -> None:
        self.placer.by_load = count

    def expect(self, key: str, hashes: tuple[int, ...], prompt_tokens: int) -> None:
        """The request with affinity key ``key`` has these router-side block hashes."""
        self._expected[key] = PromptPrefix(hashes=hashes, prompt_tokens=prompt_tokens)

    def started(self, endpoint_id: int, key: str) -> None:
        """Its first token came: its prefill is no longer queued."""
        prefix = self._sent.pop(key, None)
        if prefix is not None:
            self.placer.started(prefix)

    def prefix_room(
        self,
        roomy: Sequence[EndpointSnap],
        candidates: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None,
        waited_s: float,
    ) -> Sequence[EndpointSnap]:
        """As the router's placement: the placer may hold the request for a full endpoint
        (:meth:`PrefixPlacer.room`); its prefix is the one :meth:`expect` registered."""
        if prefix is None and affinity_key:
            prefix = self._expected.get(affinity_key)
        if prefix is None or self.mode != "prefix":
            return roomy
        return self.placer.room(prefix, roomy, candidates, waited_s=waited_s)

    def choose(
        self,
        endpoints: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        adapter: str | None = None,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap:
        if prefix is None and affinity_key:
            prefix = self._expected.pop(affinity_key, None)
        if prefix is None:
            return super().choose(endpoints, affinity_key, adapter=adapter)
        match = self.placer.match(prefix, endpoints)
        chosen: EndpointSnap | None = None
        if self.mode == "prefix":
            chosen = self.placer.sticky(endpoints, match, lambda e: self.inflight.get(e, 0))
        else:
            self.placer.by_load += 1
        if chosen is None:
            chosen = super().choose(endpoints, affinity_key)
        self.placer.sent(chosen.id, prefix, match)
        if affinity_key is not None:
            self._sent[affinity_key] = prefix
        return chosen
