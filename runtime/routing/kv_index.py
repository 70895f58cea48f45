"""The router's prefix index with the engines' KV events behind it: precise where they flow.

:class:`EventedPrefixIndex` *is* the approximate :class:`~runtime.routing.prefix_index.
PrefixIndex` (it learns from every dispatch, so falling back is warm) and owns a
:class:`~runtime.routing.kv_tracker.KvEventTracker` that the KV event subscribers
(:mod:`runtime.routing.kv_subscriber`) feed. Whoever holds a ``PrefixIndex`` (the router's
``PrefixPlacer``) gets precise scoring without knowing it:

- :meth:`record` (a dispatch) records approximately and tells the tracker, which maps the
  engine's coming ``BlockStored`` events onto these blocks;
- :meth:`match` answers each endpoint whose events are live from the tracker's precise index
  (the larger of it and this index, bounded to the engine's capacity, once the events revealed
  it), and every other endpoint (no events announced, or events stopped) from this index;
  while no endpoint's events are live (:meth:`KvEventTracker.any_live`), it is this index's
  match, with nothing built to ask the tracker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from runtime.routing.kv_tracker import KvEventTracker
from runtime.routing.prefix_index import (
    DEFAULT_MAX_BLOCKS_PER_ENDPOINT,
    DEFAULT_TTL_SECONDS,
    PrefixIndex,
)


class EventedPrefixIndex(PrefixIndex):
    """A :class:`PrefixIndex` answering precisely where KV events flow (module docstring)."""

    __slots__ = ("tracker",)

    def __init__(
        self,
        *,
        max_blocks_per_endpoint: int = DEFAULT_MAX_BLOCKS_PER_ENDPOINT,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        tracker: KvEventTracker | None = None,
    ) -> None:
        super().__init__(max_blocks_per_endpoint=max_blocks_per_endpoint, ttl_seconds=ttl_seconds)
        self.tracker = tracker if tracker is not None else KvEventTracker()
        self.tracker.approximate = self  # removals and clears reach the approximate view too

    def record(self, endpoint_id: int, hashes: Sequence[int], now: float) -> None:
        super().record(endpoint_id, hashes, now)
        self.tracker.note_dispatch(endpoint_id, hashes, now)

    def match(
        self, hashes: Sequence[int], now: float, endpoint_ids: Iterable[int] | None = None
    ) -> dict[int, int]:
        if not self.tracker.any_live():  # no events flow anywhere: this index answers alone
            return super().match(hashes, now, endpoint_ids)
        ids = list(self.sizes()) if endpoint_ids is None else list(endpoint_ids)
        return self.tracker.match(hashes, now, ids, super().match)
