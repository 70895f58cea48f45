"""The router's approximate prefix index: which prompt blocks each endpoint probably holds.

The router learns from its own choices: when it sends a request to an endpoint, that engine
will cache the request's full blocks, so :meth:`PrefixIndex.record` notes the request's block
hashes (:mod:`runtime.routing.prefix`) for that endpoint. :meth:`PrefixIndex.match` answers,
per endpoint, the number of a new prompt's leading blocks it holds (a miss ends the run, as in
the engine: a block is only useful after its whole prefix).

Forgetting, so the index tracks what an engine can still hold and its memory is bounded:

- **LRU**: at most ``max_blocks_per_endpoint`` blocks per endpoint (set it near the engine's
  prefix-cache capacity in blocks of this size; :meth:`PrefixIndex.limit` bounds one endpoint
  lower, as the KV-event tracker does with the capacity its events reveal); recording
  touches a request's blocks tail first, so the least recently used chain is dropped from its
  tail, as vLLM evicts.
- **TTL**: a block not recorded for ``ttl_seconds`` no longer matches (an engine under other
  traffic has probably evicted it); expired blocks are dropped lazily from the LRU end.
- an endpoint that leaves the snapshot is dropped (:meth:`retain`, :meth:`forget`).

Memory: one ``OrderedDict`` entry (a 64-bit hash key and a float timestamp) per block. The
bound is ``max_blocks_per_endpoint`` entries per endpoint; :meth:`approx_bytes` estimates it and
``tests/runtime/routing/test_routing_prefix.py`` measures it with ``tracemalloc``: about 180
bytes per block on CPython 3.11 (the int key, the dict slot, the LRU link), so ~3 MB per
endpoint at the default 16,384 blocks, which index 4.2 M characters (~1 M tokens) of prompt
per endpoint, more than a typical engine's KV cache holds.

Cost: a match is a binary search, ``log2(blocks)`` dict lookups per endpoint; a record is one
insert or ``move_to_end`` per block. This process only: nothing is
shared between routers (each learns from its own traffic).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

DEFAULT_MAX_BLOCKS_PER_ENDPOINT: Final = 16_384
DEFAULT_TTL_SECONDS: Final = 600.0


class PrefixIndex:
    """Block hashes per endpoint, LRU- and TTL-bounded; pass ``now`` (a monotonic clock).

    Invariant: per endpoint, the held young blocks of any prompt form a prefix of its chain.
    A block hash covers its parent, :meth:`record` always notes a whole chain from its root
    and touches it tail first, so a parent is never older than its child: LRU eviction and
    the TTL drop a chain from its tail. :meth:`match` relies on it to binary-search.
    """

    __slots__ = ("_endpoints", "_limits", "max_blocks_per_endpoint", "ttl_seconds")

    def __init__(
        self,
        *,
        max_blocks_per_endpoint: int = DEFAULT_MAX_BLOCKS_PER_ENDPOINT,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
    ) -> None:
        if max_blocks_per_endpoint < 1:
            raise ValueError("max_blocks_per_endpoint must be >= 1")
        if not ttl_seconds > 0:
            raise ValueError("ttl_seconds must be > 0")
        self.max_blocks_per_endpoint = max_blocks_per_endpoint
        self.ttl_seconds = ttl_seconds
        self._endpoints: dict[int, OrderedDict[int, float]] = {}  # LRU first
        self._limits: dict[int, int] = {}  # per-endpoint bounds below the default (:meth:`limit`)

    def record(self, endpoint_id: int, hashes: Sequence[int], now: float) -> None:
        """``endpoint_id`` was sent a prompt with these block hashes: it will cache them."""
        if not hashes:
            return
        blocks = self._endpoints.get(endpoint_id)
        if blocks is None:
            blocks = self._endpoints[endpoint_id] = OrderedDict()
        for block_hash in reversed(hashes):  # tail first: the chain's root ends most recent
            blocks[block_hash] = now
            blocks.move_to_end(block_hash)
        self._trim(blocks, self._limits.get(endpoint_id, self.max_blocks_per_endpoint))
        self._expire(blocks, now)

    def limit(self, endpoint_id: int, max_blocks: int) -> None:
        """Bound one endpoint's blocks (LRU) to ``max_blocks`` (at most the default bound): its
        engine's KV capacity in router blocks, once known (:mod:`runtime.routing.kv_tracker`)."""
        bound = max(1, min(max_blocks, self.max_blocks_per_endpoint))
        self._limits[endpoint_id] = bound
        blocks = self._endpoints.get(endpoint_id)
        if blocks is not None:
            self._trim(blocks, bound)

    @staticmethod
    def _trim(blocks: OrderedDict[int, float], bound: int) -> None:
        while len(blocks) > bound:
            blocks.popitem(last=False)

    def match(
        self, hashes: Sequence[int], now: float, endpoint_ids: Iterable[int] | None = None
    ) -> dict[int, int]:
        """Per endpoint (all known, or ``endpoint_ids``), how many leading blocks it holds;
        endpoints holding none are left out."""
        found: dict[int, int] = {}
        if not hashes:
            return found
        oldest = now - self.ttl_seconds
        first = hashes[0]
        ids = self._endpoints.keys() if endpoint_ids is None else endpoint_ids
        for endpoint_id in ids:
            blocks = self._endpoints.get(endpoint_id)
            if not blocks:
                continue
            seen = blocks.get(first)
            if seen is None or seen < oldest:
                continue  # not even the first block (a prompt no one sent): one lookup
            # Held blocks are prefix-closed (see the class docstring): binary search for the
            # longest held prefix, O(log blocks) lookups per endpoint.
            low, high = 1, len(hashes)
            while low < high:
                middle = (low + high + 1) // 2
                seen = blocks.get(hashes[middle - 1])
                if seen is not None and seen >= oldest:
                    low = middle
                else:
                    high = middle - 1
            found[endpoint_id] = low
        return found

    def holds(self, endpoint_id: int, block_hash: int, now: float) -> bool:
        """Whether the endpoint holds this block (not expired): :meth:`match` of one block."""
        blocks = self._endpoints.get(endpoint_id)
        if not blocks:
            return False
        seen = blocks.get(block_hash)
        return seen is not None and seen >= now - self.ttl_seconds

    def forget(self, endpoint_id: int) -> None:
        """Drop everything known about one endpoint (it restarted, or left)."""
        self._endpoints.pop(endpoint_id, None)
        self._limits.pop(endpoint_id, None)

    def retain(self, endpoint_ids: Iterable[int]) -> None:
        """Keep only these endpoints (the snapshot's)."""
        keep = set(endpoint_ids)
        for endpoint_id in [e for e in self._endpoints if e not in keep]:
            del self._endpoints[endpoint_id]
        for endpoint_id in [e for e in self._limits if e not in keep]:
            del self._limits[endpoint_id]

    def blocks(self, endpoint_id: int) -> int:
        """How many blocks are indexed for the endpoint (expired ones may still count)."""
        blocks = self._endpoints.get(endpoint_id)
        return 0 if blocks is None else len(blocks)

    def sizes(self) -> Mapping[int, int]:
        return {endpoint_id: len(blocks) for endpoint_id, blocks in self._endpoints.items()}

    def approx_bytes(self, endpoint_id: int) -> int:
        """Estimated memory of one endpoint's entries: the dict plus its keys and values."""
        blocks = self._endpoints.get(endpoint_id)
        if blocks is None:
            return 0
        # OrderedDict keeps a hash table plus a linked list node per entry; keys are ints
        # above the small-int cache (28-32 bytes each), values floats (24 bytes; shared when
        # one record stores one ``now`` object for all its blocks).
        per_entry = sys.getsizeof(1 << 62) + 16 * 3
        return sys.getsizeof(blocks) + len(blocks) * per_entry

    def _expire(self, blocks: OrderedDict[int, float], now: float) -> None:
        oldest = now - self.ttl_seconds
        while blocks:
            block_hash, seen = next(iter(blocks.items()))
            if seen >= oldest:
                return
            del blocks[block_hash]

    def discard(self, endpoint_id: int, hashes: Iterable[int]) -> None:
        """The endpoint no longer holds these blocks (its engine evicted them: KV events,
        :mod:`runtime.routing.kv_tracker`). The engine evicts a chain from its tail, so the
        blocks' descendants are already gone and the held blocks stay prefix-closed."""
        blocks = self._endpoints.get(endpoint_id)
        if blocks is None:
            return
        for block_hash in hashes:
            blocks.pop(block_hash, None)
