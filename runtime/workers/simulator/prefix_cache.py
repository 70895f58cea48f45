"""The simulator's prefix cache: vLLM's automatic prefix caching over a stand-in tokenizer.

Tokens. The stand-in tokenizer (:mod:`runtime.workers.simulator.text`) counts a string as
``ceil(len / 4)`` tokens; here a prompt is *rendered* so that every token is exactly four
characters and the count is unchanged: text is cut into 4-character tokens (the last one padded
with NULs; an empty prompt is one BOS token), and a chat prompt is, per message, three header
tokens (start, role, newline), the content's tokens and one end token, then the generation
prompt: an assistant message's three header tokens (``MESSAGE_OVERHEAD_TOKENS`` = 4,
``GENERATION_PROMPT_TOKENS`` = 3). The same prompt prefix therefore gives the same tokens,
whatever follows it, and a conversation's next turn (the answer appended as an assistant
message) repeats every token of the turn before. As vLLM's chat templates, a request may ask
for ``add_generation_prompt: false`` (no generation header) or ``continue_final_message: true``
(the final message left open: no end token, no generation header); a resumed stream's
continuation (the prompt plus an assistant message holding the text so far, see
``runtime.gateway.resume``) then renders as the original prompt's rendering followed by the
text, padded only at its end. A prompt given as token ids is its ids.

Blocks (as vLLM's ``kv_cache_utils.hash_block_tokens``): a prompt's *full* blocks of
``block_size`` tokens are hashed in a chain, each block's hash covering its parent's hash and
its own tokens, so a block hash names the whole prefix up to the end of that block. The last,
partial block is never cached.

The cache (as vLLM's ``KVCacheManager`` with prefix caching on): a request's hit is the longest
run of its leading block hashes found in the cache; at most ``prompt_tokens - 1`` tokens count
as hits (vLLM recomputes the last prompt token to get logits). Its full blocks are then cached
(at admission, so a request admitted in the same step already hits them, as vLLM caches blocks
when it allocates them). When a sequence leaves the batch (finished or aborted once running),
the engine caches the full blocks of its rendered prompt followed by the text it generated
(every token it computed, which the client's text so far is a prefix of), as vLLM keeps a freed
request's computed blocks in its cache: a continuation of that generation on the same engine
hits the prompt's and the generated text's blocks, as it does on vLLM when the text
re-tokenizes to the same tokens. Here that holds for a chat continuation always (the open
assistant message starts on a token boundary) and for a completion continuation (prompt +
text) when the prompt's length is a multiple of 4 characters; otherwise the prompt's last,
padded token differs (the stand-in for BPE merging across the seam) and the continuation hits
only the prompt's blocks before it. A prompt given as token ids caches its prompt blocks only
(the generated text has no ids). Eviction is LRU over blocks, and a request's blocks are
touched tail first, so the root of a chain is the most recently used and a chain is evicted
from its tail (vLLM frees a request's blocks in reverse order for the same reason). Capacity is
a number of blocks; unlike vLLM, cached blocks do not compete with the running sequences' KV
reservations (the simulator reserves those separately, see ``timing.Capacity``).

Hashes use Python's ``hash()`` of strings and tuples: stable within one simulator process, which
is all an engine's cache needs (vLLM's hashes are per-process too unless seeded).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

CHARS_PER_TOKEN = 4
_PAD = "\x00"
_BOS = _PAD * CHARS_PER_TOKEN
_START = "\x02st\x02"
_NEWLINE = "\x02nl\x02"
_END = "\x02en\x02"
_GENERATION = _START + "assi" + _NEWLINE  # an assistant message's header, as chat templates
_ROOT_HASH = hash("switchyard-simulator-prefix-root")


def render_text(text: str) -> str:
    """``text`` as 4-character tokens: padded to a multiple of 4; an empty text is one BOS."""
    if not text:
        return _BOS
    return text + _PAD * (-len(text) % CHARS_PER_TOKEN)


def render_chat(
    messages: Sequence[tuple[str, str]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """A chat prompt (``(role, content)`` per message, in order) as 4-character tokens.

    As vLLM's chat templates: ``add_generation_prompt`` appends an assistant message's header;
    ``continue_final_message`` leaves the final message open (no end token, and then no
    generation header), so a continuation's rendering is its prompt's rendering followed by
    the text so far (padded only at its end).
    """
    parts: list[str] = []
    last = len(messages) - 1
    for index, (role, content) in enumerate(messages):
        parts.append(_START)
        parts.append((role + _PAD * CHARS_PER_TOKEN)[:CHARS_PER_TOKEN])
        parts.append(_NEWLINE)
        if content:
            parts.append(content + _PAD * (-len(content) % CHARS_PER_TOKEN))
        if not (continue_final_message and index == last):
            parts.append(_END)
    if add_generation_prompt and not continue_final_message:
        parts.append(_GENERATION)
    return "".join(parts)


def text_block_hashes(rendered: str, block_size: int, known: Sequence[int] = ()) -> tuple[int, ...]:
    """The chained hashes of the full blocks of a rendered prompt (4 characters a token).

    ``known``: the hashes of the string's leading blocks, already computed (a finished
    sequence's prompt blocks): they are kept and the chain goes on from the last of them.
    """
    width = block_size * CHARS_PER_TOKEN
    hashes: list[int] = list(known)
    parent = hashes[-1] if hashes else _ROOT_HASH
    for start in range(len(hashes) * width, len(rendered) - width + 1, width):
        parent = hash((parent, rendered[start : start + width]))
        hashes.append(parent)
    return tuple(hashes)


def token_block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The chained hashes of the full blocks of a prompt given as token ids."""
    hashes: list[int] = []
    parent = _ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return tuple(hashes)


def sequence_block_hashes(key: int, tokens: int, block_size: int) -> tuple[int, ...]:
    """The chained hashes of the full blocks of ``tokens`` tokens that belong to one
    sequence alone (its ``key``): the bench's engines cache a preempted generation's prompt
    and generated tokens without rendering them (``bench.sim_engine``)."""
    hashes: list[int] = []
    parent = _ROOT_HASH
    for index in range(tokens // block_size):
        parent = hash((parent, key, index))
        hashes.append(parent)
    return tuple(hashes)


@dataclass(frozen=True, slots=True)
class PrefixCacheConfig:
    """``block_size`` tokens per block; ``capacity_blocks`` cached blocks (0: caching off)."""

    block_size: int = 16
    capacity_blocks: int = 4096

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {self.capacity_blocks}")

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0


class CacheListener(Protocol):
    """Told what the cache stores and evicts, as vLLM's KV events say it (``kv_publisher``)."""

    def stored(self, parent: int | None, hashes: Sequence[int], block_size: int) -> None: ...

    def removed(self, hashes: Sequence[int]) -> None: ...

    def cleared(self) -> None: ...


class PrefixCache:
    """An LRU set of block hashes with vLLM's hit rule; one per simulated engine."""

    __slots__ = ("_blocks", "config", "evictions", "listener")

    def __init__(self, config: PrefixCacheConfig, listener: CacheListener | None = None) -> None:
        self.config = config
        self._blocks: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.evictions = 0
        self.listener = listener

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def reset(self) -> None:
        """Drop every cached block (vLLM's ``POST /reset_prefix_cache``)."""
        self._blocks.clear()
        if self.listener is not None:
            self.listener.cleared()

    def hit_tokens(self, block_hashes: Sequence[int], prompt_tokens: int) -> int:
        """Tokens of the prompt already cached (read only: the LRU order is not changed)."""
        hit_blocks = 0
        for block_hash in block_hashes:
            if block_hash not in self._blocks:
                break
            hit_blocks += 1
        return max(0, min(hit_blocks * self.config.block_size, prompt_tokens - 1))

    def admit(self, block_hashes: Sequence[int], prompt_tokens: int) -> int:
        """A request's prompt enters the engine: its cached tokens, then its blocks cached."""
        if not self.config.enabled:
            return 0
        hit = self.hit_tokens(block_hashes, prompt_tokens)
        self.store(block_hashes)
        return hit

    def store(self, block_hashes: Sequence[int]) -> None:
        """Cache a chain of blocks (a prompt's at admission, a freed sequence's prompt and
        generated blocks when it leaves the batch): the listener is told the new ones, the
        chain is touched tail first and the least recently used blocks are evicted."""
        if not self.config.enabled:
            return
        blocks = self._blocks
        listener = self.listener
        if listener is not None:  # the chain's new blocks, after its longest cached run
            held = next((i for i, h in enumerate(block_hashes) if h not in blocks), None)
            if held is not None:
                parent = block_hashes[held - 1] if held else None
                listener.stored(parent, block_hashes[held:], self.config.block_size)
        for block_hash in reversed(block_hashes):  # tail first: the root ends most recent
            if block_hash in blocks:
                blocks.move_to_end(block_hash)
            else:
                blocks[block_hash] = None
        evicted: list[int] = []
        while len(blocks) > self.config.capacity_blocks:
            evicted.append(blocks.popitem(last=False)[0])
            self.evictions += 1
        if evicted and listener is not None:
            listener.removed(evicted)
