"""Precise prefix scoring: the engines' KV events, mapped onto the router's block hashes.

An engine's KV events (:mod:`runtime.routing.kv_events`) name *its* blocks: hashes of token ids,
``block_size`` tokens each. The router has no tokenizer; its blocks
(:mod:`runtime.routing.prefix`) are ``block_chars`` characters of the rendered prompt. The two
cannot be computed from each other, so the mapping is **learned at dispatch**:

1. :meth:`KvEventTracker.note_dispatch`: the router sends a prompt (its router hashes) to an
   endpoint; the prompt waits there as *pending* (bounded FIFO), even when the endpoint is known
   to hold all its router blocks: the engine's blocks are finer (16 tokens against 64), so it
   still stores the blocks of the prompt's last, partial router block, and a conversation's next
   turn continues them. Only for an endpoint whose events are subscribed to
   (:meth:`KvEventTracker.watch`, told by the subscribers at each snapshot): a dispatch to any
   other keeps nothing, as no event will ever claim it.
2. A ``BlockStored`` event continues a chain: from the prompt's start (``parent`` ``None``) or
   from a block already mapped. A chain from the start is attributed to the oldest pending
   prompt whose first router block the engine is not already known to hold (it would not store
   it again). A chain continuing a mapped block (of prompt ``P``) is, in this order: ``P``'s
   prefill's next chunk, when it continues ``P``'s tail and ``P`` still waits; else the oldest
   pending prompt that shares ``P``'s router blocks up to that block (all of those ``P``'s chain
   had completed there when it continues ``P``'s tail; one less for a branch mid-chain, as the
   two renderings' template overheads differ); else ``P``'s own *unnamed* continuation: mapped
   as ``P``'s, so a later chain can continue it, but naming no router block. Engines admit in
   order, so when a prompt's first blocks are stored, the prompts sent before it that stored
   nothing are dropped (the engine held them whole; left waiting they would take others' chains).
   That is what a request's *generated* tokens' blocks are (vLLM caches a request's full decode
   blocks, and the simulator a finished sequence's answer, chained after its prompt): the router
   never hashed the answer's text, so they name nothing, and they are never attributed to a
   prompt that does not share their prefix. A conversation's next turn, whose history is the
   prompt and that answer, is learned when the engine stores its own blocks after the answer's
   (it hit them): its router blocks up to there are then held. A next turn already pending when
   the answer's blocks are stored takes them (it shares the prefix): right when its history holds
   the engine's own answer, as a chat client's does; a client that sends another text as the
   answer makes the index overstate that turn's held blocks until they are evicted.
3. Engine block ``i`` of the chain ends at token ``end = parent_end + (i + 1) * block_size``; it
   completes router block ``k = end * chars_per_token // block_chars`` (4 characters a token,
   the router's rule of thumb). The engine block where ``k`` first reaches a router block maps to
   that router block; the precise index (:class:`PrefixIndex`, its own instance) records the
   prompt's router blocks up to ``k``.
4. ``BlockRemoved``: each removed engine block that mapped to a router block drops that router
   block (vLLM evicts a chain from its tail, so its descendants went first);
   ``AllBlocksCleared`` forgets the endpoint, in the approximate index too. Removals are not
   applied to the approximate index: it is bounded to the engine's capacity instead (below),
   and the two together forget too much (a router block can map to more than one engine
   block, and a removed one frees room that keeps older, unattributed, evicted blocks).

**Fallback.** An endpoint is *precise* while its subscriber is connected and its events keep up:
it stops being precise when a prompt the engine must store (it did not hold its first block) has
waited ``stale_s`` with no event at all since it was sent (an idle engine publishes nothing, so
silence alone is not staleness), or when the socket drops. :meth:`match` answers a precise
endpoint from the precise index and any other from the approximate one (which keeps learning from
dispatch all along, so falling back is warm); it is precise again at its next event.

**The bounded belief.** Precise alone under-claims: blocks the tracker could not attribute (a
history holding the engine's own answer, chains it never mapped) are held but unknown to it
(``docs/performance/2026-11-26-prefix-routing.md``, (e)). Once the engine has evicted, its KV
capacity is known: the high-water mark of stored minus removed engine blocks, in router blocks
(``block_chars // chars_per_token`` tokens each; counted per message, as an engine may report
a store before the evictions it caused). The tracker then bounds the approximate
index's LRU for that endpoint to it (:meth:`PrefixIndex.limit`), so it forgets about as fast as
the engine, and a precise endpoint's belief is the larger of the precise match and that bounded
approximate one. Before the first eviction both behave as before (precise alone; the approximate
index at its default bound).

Memory per endpoint is bounded: ``max_engine_blocks`` mapped engine blocks (an ``OrderedDict``
entry of a hash and a small node, oldest dropped first; generated blocks count too), ``max_pending``
pending prompts (each a reference to its tuple of router hashes) and the precise index's own
bound. Measured with answers' blocks mapped: ~290 bytes a mapped engine block with its share of
the prompts it references (``tests/runtime/routing/test_kv_events.py``), ~4.7 MB at the default
bound.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from runtime.routing.kv_events import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    KvEventBatch,
)
from runtime.routing.prefix import CHARS_PER_TOKEN, DEFAULT_BLOCK_CHARS
from runtime.routing.prefix_index import PrefixIndex

DEFAULT_STALE_S: Final = 10.0
DEFAULT_MAX_PENDING: Final = 256
DEFAULT_MAX_ENGINE_BLOCKS: Final = 16_384

Matcher = Callable[[Sequence[int], float, Iterable[int]], dict[int, int]]


class _Pending:
    """A prompt sent to the endpoint whose blocks the engine has not all reported yet."""

    __slots__ = ("at", "end", "expects", "hashes")

    def __init__(self, hashes: tuple[int, ...], at: float, *, expects: bool) -> None:
        self.hashes = hashes
        self.at = at
        self.expects = expects  # the engine must store a block for it (it held none)
        self.end = 0  # where its chain's last mapped engine block ends (tokens)


@dataclass(slots=True)
class _Node:
    """One engine block: where it ends (tokens), the router block it completes (if any), and
    how many of its prompt's router blocks the chain has completed up to its end."""

    end: int
    router: int | None
    prompt: _Pending
    reached: int


class _Endpoint:
    __slots__ = (
        "block_size",
        "blocks",
        "connected",
        "evicted",
        "last_event",
        "live",
        "peak",
        "pending",
        "stale",
    )

    def __init__(self, max_pending: int) -> None:
        self.blocks: OrderedDict[EngineHash, _Node] = OrderedDict()
        self.pending: deque[_Pending] = deque(maxlen=max_pending)
        self.last_event: float | None = None
        self.connected = False
        self.stale = False  # a prompt went unanswered: approximate until the next event
        self.live = 0  # engine blocks stored and not removed (all of them, mapped or not)
        self.peak = 0  # the high-water mark of ``live``: the capacity, once ``evicted``
        self.evicted = False  # a BlockRemoved was seen: the cache was full at ``peak``
        self.block_size = 0  # tokens per engine block (the last BlockStored's)


class KvEventTracker:
    """Per endpoint: engine blocks mapped to router blocks, pending prompts, freshness."""

    __slots__ = (
        "_endpoints",
        "_live",
        "_watched",
        "approximate",
        "block_chars",
        "chars_per_token",
        "max_engine_blocks",
        "max_pending",
        "precise_index",
        "stale_s",
    )

    def __init__(
        self,
        *,
        approximate: PrefixIndex | None = None,
        precise_index: PrefixIndex | None = None,
        block_chars: int = DEFAULT_BLOCK_CHARS,
        chars_per_token: int = CHARS_PER_TOKEN,
        stale_s: float = DEFAULT_STALE_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_engine_blocks: int = DEFAULT_MAX_ENGINE_BLOCKS,
    ) -> None:
        if block_chars < 1 or chars_per_token < 1:
            raise ValueError("block_chars and chars_per_token must be >= 1")
        if not stale_s > 0 or max_pending < 1 or max_engine_blocks < 1:
            raise ValueError("stale_s, max_pending and max_engine_blocks must be positive")
        self.approximate = approximate
        self.precise_index = precise_index if precise_index is not None else PrefixIndex()
        self.block_chars = block_chars
        self.chars_per_token = chars_per_token
        self.stale_s = stale_s
        self.max_pending = max_pending
        self.max_engine_blocks = max_engine_blocks
        self._endpoints: dict[int, _Endpoint] = {}
        # Endpoints connected with an event since: the only ones :meth:`precise` may answer
        # True for (a superset: staleness is judged there), so none means all approximate.
        self._live: set[int] = set()
        # Endpoints whose events are subscribed to (:meth:`watch`); None: any (not told).
        self._watched: set[int] | None = None

    # --- the router's side --------------------------------------------------------------

    def note_dispatch(self, endpoint_id: int, hashes: Sequence[int], now: float) -> None:
        """The router sent a prompt with these router block hashes to the endpoint (nothing is
        kept for an endpoint whose events nobody subscribes to: :meth:`watch`)."""
        if not hashes or (self._watched is not None and endpoint_id not in self._watched):
            return
        state = self._state(endpoint_id)
        held = self.precise_index.holds(endpoint_id, hashes[0], now)
        state.pending.append(_Pending(tuple(hashes), now, expects=not held))

    def watch(self, endpoint_ids: Iterable[int]) -> None:
        """The endpoints whose events are subscribed to (the subscribers' :meth:`~runtime.
        routing.kv_subscriber.KvEventSubscribers.sync`): a dispatch to any other keeps no
        pending prompt, since no event can ever claim it. Until told, every endpoint is."""
        self._watched = set(endpoint_ids)

    def precise(self, endpoint_id: int, now: float) -> bool:
        """Whether the endpoint's events are live (see the module docstring)."""
        state = self._endpoints.get(endpoint_id)
        if state is None or not state.connected or state.last_event is None or state.stale:
            return False
        last_event = state.last_event
        for prompt in state.pending:  # oldest first: the oldest unanswered one decides
            if prompt.expects and prompt.at >= last_event:
                if prompt.at <= now - self.stale_s:
                    state.stale = True
                    return False
                break
        return True

    def any_live(self) -> bool:
        """Whether some endpoint may be precise (connected, with an event since): when none is,
        :meth:`match` is the approximate index's answer."""
        return bool(self._live)

    def capacity(self, endpoint_id: int) -> int | None:
        """The endpoint's engine's KV capacity in router blocks, once an eviction revealed it."""
        state = self._endpoints.get(endpoint_id)
        if state is None or not state.evicted:
            return None
        tokens = state.peak * state.block_size
        return max(1, tokens * self.chars_per_token // self.block_chars)

    def match(
        self,
        hashes: Sequence[int],
        now: float,
        endpoint_ids: Iterable[int],
        approximate: Matcher | None = None,
    ) -> dict[int, int]:
        """Per endpoint, its held leading blocks: where events are live, the precise match, or
        the larger of it and the approximate one once the capacity is known (module docstring);
        elsewhere the approximate guess (nothing, without one). ``approximate`` replaces
        ``self.approximate.match`` (for an index that is its own approximate one)."""
        if approximate is None and self.approximate is not None:
            approximate = self.approximate.match
        if not self._live:  # no endpoint's events flow (the usual case): all approximate
            return {} if approximate is None else approximate(hashes, now, endpoint_ids)
        precise: list[int] = []
        guessed: list[int] = []
        for endpoint_id in endpoint_ids:
            if not self.precise(endpoint_id, now):
                guessed.append(endpoint_id)
                continue
            precise.append(endpoint_id)
            if self._endpoints[endpoint_id].evicted:
                guessed.append(endpoint_id)
        found = self.precise_index.match(hashes, now, precise) if precise else {}
        if guessed and approximate is not None:
            for endpoint_id, blocks in approximate(hashes, now, guessed).items():
                found[endpoint_id] = max(blocks, found.get(endpoint_id, 0))
        return found

    # --- the subscriber's side ----------------------------------------------------------

    def set_connected(self, endpoint_id: int, connected: bool) -> None:
        """The subscriber's socket connected (or dropped: fall back until the next event)."""
        state = self._state(endpoint_id)
        state.connected = connected
        if not connected:
            state.last_event = None
            self._live.discard(endpoint_id)

    def apply(self, endpoint_id: int, batch: KvEventBatch, now: float) -> None:
        """One message of the endpoint's events."""
        state = self._state(endpoint_id)
        state.last_event = now
        state.connected = True
        self._live.add(endpoint_id)
        state.stale = False
        for event in batch.events:
            if isinstance(event, BlockStored):
                state.live += len(event.hashes)
                state.block_size = event.block_size
                self._stored(endpoint_id, state, event, now)
            elif isinstance(event, BlockRemoved):
                state.live = max(0, state.live - len(event.hashes))
                state.evicted = True
                self._removed(endpoint_id, state, event.hashes)
            elif isinstance(event, AllCleared):
                state.live = 0
                state.blocks.clear()
                self.precise_index.forget(endpoint_id)
                if self.approximate is not None:
                    self.approximate.forget(endpoint_id)
        self._expire(state, now)
        # Per message, not per event: an engine may report a store before the evictions it
        # caused (the simulator does), so only the message's end count is a cache's content.
        state.peak = max(state.peak, state.live)
        capacity = self.capacity(endpoint_id)
        if capacity is not None and self.approximate is not None:
            self.approximate.limit(endpoint_id, capacity)

    def forget(self, endpoint_id: int) -> None:
        self._endpoints.pop(endpoint_id, None)
        self._live.discard(endpoint_id)
        self.precise_index.forget(endpoint_id)

    def retain(self, endpoint_ids: Iterable[int]) -> None:
        keep = set(endpoint_ids)
        for endpoint_id in [e for e in self._endpoints if e not in keep]:
            self.forget(endpoint_id)

    def sizes(self) -> Mapping[int, tuple[int, int]]:
        """Per endpoint: (mapped engine blocks, pending prompts)."""
        return {e: (len(s.blocks), len(s.pending)) for e, s in self._endpoints.items()}

    # --- internals ------------------------------------------------------------------------

    def _state(self, endpoint_id: int) -> _Endpoint:
        state = self._endpoints.get(endpoint_id)
        if state is None:
            state = self._endpoints[endpoint_id] = _Endpoint(self.max_pending)
        return state

    def _attribute(
        self, endpoint_id: int, state: _Endpoint, parent: _Node | None, now: float
    ) -> tuple[_Pending, bool] | None:
        """The prompt a stored chain belongs to, and whether it names that prompt's router
        blocks (``False``: an unnamed continuation); ``None``: a chain from the start that no
        pending prompt fits. See the module docstring, 2."""
        if parent is None:
            for prompt in state.pending:
                if self._fresh(endpoint_id, prompt, now):
                    return prompt, True
            return None
        owner = parent.prompt
        tail = parent.end >= owner.end
        if tail and owner in state.pending:
            return owner, True  # its prefill's next chunk
        # At the owner's tail the chain may be the owner's own (generated) continuation: a
        # pending prompt takes it only if it shares every router block the owner had there.
        # A branch mid-chain is another prompt's: one block less will do (the two renderings'
        # template overheads differ, so ``reached`` may count one block too many).
        reached = parent.reached
        least = max(reached if tail else reached - 1, 1)
        shared = owner.hashes[least - 1]  # chained: holding it at its place, it holds all before
        from_start = not tail and reached <= 1  # under a router block shared: as from the start
        for prompt in state.pending:
            if prompt is owner:
                continue
            # Chained hashes are unique within a prompt: holding ``shared`` at its place is
            # holding it at all (no per-prompt position map: a dispatch builds nothing).
            if (len(prompt.hashes) >= least and prompt.hashes[least - 1] == shared) or (
                from_start and self._fresh(endpoint_id, prompt, now)
            ):
                return prompt, True
        return owner, False

    def _fresh(self, endpoint_id: int, prompt: _Pending, now: float) -> bool:
        """Whether the engine is not known to hold the prompt's first router block."""
        return not self.precise_index.match(prompt.hashes[:1], now, (endpoint_id,))

    def _stored(self, endpoint_id: int, state: _Endpoint, event: BlockStored, now: float) -> None:
        parent: _Node | None = None
        if event.parent is not None:
            parent = state.blocks.get(event.parent)
            if parent is None:
                return  # continues a chain this router never mapped: cannot place it
        attributed = self._attribute(endpoint_id, state, parent, now)
        if attributed is None:
            return  # nothing pending fits a chain from the start: it is not placed
        prompt, learns = attributed
        if learns and not prompt.end:
            self._admitted(state, prompt)
        base = 0 if parent is None else parent.end
        # Generated blocks (``learns`` False, always with a parent) name no router block.
        covered = self._covered(base, prompt) if learns or parent is None else parent.reached
        blocks = state.blocks
        end = base
        for i, engine_hash in enumerate(event.hashes):
            end = base + (i + 1) * event.block_size
            reached = self._covered(end, prompt) if learns else covered
            router = prompt.hashes[reached - 1] if reached > covered else None
            covered = reached
            blocks[engine_hash] = _Node(end, router, prompt, covered)
            blocks.move_to_end(engine_hash)
        if learns:  # an unnamed continuation leaves its owner's tail where it was
            prompt.end = max(prompt.end, end)
        while len(blocks) > self.max_engine_blocks:
            blocks.popitem(last=False)
        if not learns:
            return
        if covered:
            self.precise_index.record(endpoint_id, prompt.hashes[:covered], now)
        if covered >= len(prompt.hashes):
            state.pending.remove(prompt)

    @staticmethod
    def _admitted(state: _Endpoint, prompt: _Pending) -> None:
        """The prompt's first blocks are stored: an engine admits in order, so prompts sent
        before it that have stored nothing never will (the engine held them whole)."""
        pending = state.pending
        while pending and pending[0] is not prompt and not pending[0].end:
            pending.popleft()

    def _covered(self, end_tokens: int, prompt: _Pending) -> int:
        """How many of the prompt's router blocks end within its first ``end_tokens``."""
        return min(end_tokens * self.chars_per_token // self.block_chars, len(prompt.hashes))

    def _removed(self, endpoint_id: int, state: _Endpoint, hashes: Sequence[EngineHash]) -> None:
        dropped: list[int] = []
        for engine_hash in hashes:
            node = state.blocks.pop(engine_hash, None)
            if node is not None and node.router is not None:
                dropped.append(node.router)
        if dropped:  # not from the approximate index: its bound to the capacity forgets instead
            self.precise_index.discard(endpoint_id, dropped)

    def _expire(self, state: _Endpoint, now: float) -> None:
        """Pending prompts the events answered long ago or never will (cached in full)."""
        oldest = now - 2 * self.stale_s
        pending = state.pending
        while pending and pending[0].at < oldest:
            pending.popleft()
