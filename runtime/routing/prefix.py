"""Approximate prefix matching: chained block hashes of a rendered prompt, and one match.

The router has no tokenizer, so a prompt is cut into blocks of ``block_chars`` characters
(default 256, about 64 tokens at the usual four characters a token) of its *rendering*: a chat
prompt is its messages in order, each as ``role`` + US + ``content`` + RS, so a shared system
prompt gives the same first blocks to every conversation that starts with it, and a
conversation's next turn (its history plus one message) repeats all the blocks of the turn
before. A completion prompt is its text. Only full blocks are hashed; the last, partial block
never matches (an engine does not cache a partial block either).

Each block's hash covers its parent's hash and its own characters (as vLLM's block hashes do),
so one hash names a whole prefix and two prompts share block ``k`` only if they share
everything up to its end. Hashes are Python's ``hash()`` of ``(parent, block)`` (SipHash of the
block's characters, 64 bits): stable within one router process, which is where the index that
learns them lives, and about six times cheaper than a BLAKE2b digest per block. The cost is
linear in the prompt's length; ``python -m runtime.routing.prefix`` measures it (a
4,000-character, three-message chat prompt, 15 blocks: see :func:`main`).

:class:`PrefixMatch` is what a request carries to the scorer: how many full blocks its prompt
has and how many of them each endpoint is believed to hold (from
:class:`~runtime.routing.prefix_index.PrefixIndex`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from runtime.routing.sticky import StickyRule

DEFAULT_BLOCK_CHARS: Final = 256
CHARS_PER_TOKEN: Final = 4  # the rule of thumb that turns blocks into tokens (the sticky rule)
_ROOT: Final = 0x5EED_0F_B10C
_UNIT: Final = "\x1f"
_RECORD: Final = "\x1e"


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """A chat prompt's messages (``(role, content)`` in order) as one string."""
    return "".join(f"{role}{_UNIT}{content}{_RECORD}" for role, content in messages)


def rendered_length(messages: Sequence[tuple[str, str]]) -> int:
    """``len(render_chat(messages))`` without rendering: a prompt shorter than one block has
    no full block, which this tells before anything is built."""
    return sum(len(role) + len(content) + 2 for role, content in messages)


def estimate_tokens(rendered: str) -> int:
    """A rendered prompt's tokens by the rule of thumb (``CHARS_PER_TOKEN``), rounded up: the
    unit of :meth:`PrefixMatch.cached_tokens`, so cached and uncached estimates agree."""
    return -(-len(rendered) // CHARS_PER_TOKEN)


def block_hashes(rendered: str, block_chars: int = DEFAULT_BLOCK_CHARS) -> tuple[int, ...]:
    """The chained 64-bit hashes of the full ``block_chars``-character blocks of ``rendered``."""
    if block_chars < 1:
        raise ValueError(f"block_chars must be >= 1, got {block_chars}")
    hashes: list[int] = []
    parent = _ROOT
    for start in range(0, len(rendered) - block_chars + 1, block_chars):
        parent = hash((parent, rendered[start : start + block_chars]))
        hashes.append(parent)
    return tuple(hashes)


def chat_block_hashes(
    messages: Sequence[tuple[str, str]], block_chars: int = DEFAULT_BLOCK_CHARS
) -> tuple[int, ...]:
    """:func:`block_hashes` of a chat prompt's rendering."""
    return block_hashes(render_chat(messages), block_chars)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """One request's prefix against the fleet: its full blocks and, per endpoint, how many of
    its leading blocks that endpoint is believed to hold."""

    blocks: int
    matched: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    block_chars: int = DEFAULT_BLOCK_CHARS
    rule: StickyRule | None = None  # the request's pool's sticky rule (None: the placer's)

    def fraction(self, endpoint_id: int) -> float:
        """The share of the prompt's full blocks the endpoint holds, in ``[0, 1]``."""
        if self.blocks <= 0:
            return 0.0
        return min(1.0, self.matched.get(endpoint_id, 0) / self.blocks)

    def cached_tokens(self, endpoint_id: int) -> int:
        """The endpoint's cached prefix in (estimated) tokens."""
        return self.matched.get(endpoint_id, 0) * self.block_chars // CHARS_PER_TOKEN


@dataclass(frozen=True, slots=True, eq=False)
class PromptPrefix:
    """What a request carries to placement: its prompt's block hashes and its estimated
    prompt tokens. Compared and hashed by identity: one object per request, so the placer
    can key the request's queued prefill by it."""

    hashes: tuple[int, ...]
    prompt_tokens: int
    block_chars: int = DEFAULT_BLOCK_CHARS
    rule: StickyRule | None = None  # its pool's sticky rule (pool policies); None: the default
    # Its uncached prefill counts as queued at its endpoint until its first byte: a stream's
    # first token. A unary answer's first byte is its end, seconds after its prefill, so it
    # would hold the estimate up for its whole decode: the prefix stage sets False for those.
    queues: bool = True

    def uncached_tokens(self, matched_blocks: int) -> int:
        """The prompt tokens an engine holding ``matched_blocks`` leading blocks must prefill."""
        cached = matched_blocks * self.block_chars // CHARS_PER_TOKEN
        return max(0, self.prompt_tokens - cached)


def main() -> None:  # pragma: no cover - a measurement, run by hand
    """Print the cost of hashing a 4,000-character, three-message chat prompt (µs/request)."""
    import sys  # noqa: PLC0415 - only for this measurement
    import timeit  # noqa: PLC0415

    messages = [("system", "s" * 3000), ("user", "u" * 500), ("assistant", "a" * 500)]
    runs = 20_000
    seconds = timeit.timeit(lambda: chat_block_hashes(messages), number=runs)
    blocks = len(chat_block_hashes(messages))
    sys.stdout.write(f"{blocks} blocks: {seconds / runs * 1e6:.1f} µs per request\n")


if __name__ == "__main__":  # pragma: no cover
    main()
