"""Stand-in tokenizer and deterministic output for the simulator.

Tokenizer: a prompt string counts ``ceil(len(text) / 4)`` tokens (at least 1, standing in for
the BOS token), the usual rule of thumb for English with BPE tokenizers; a prompt given as token
ids counts one token per id. A chat prompt adds a fixed template overhead of
``MESSAGE_OVERHEAD_TOKENS`` per message plus ``GENERATION_PROMPT_TOKENS`` for the assistant
turn, as a chat template would (less the final message's end token and no generation prompt
with ``continue_final_message``; no generation prompt with ``add_generation_prompt: false``).

Output: every generated token is one pseudo-word with a leading space (" lorem"), drawn from a
``random.Random`` seeded from the simulator seed, the request's ``seed`` and the prompt, so the
same request gives the same text on every run. Embeddings are unit vectors seeded the same way.

Test hook: a prompt holding ``[[emit: some words]]`` makes the answer begin with those words,
one token per word (" some", " words"), before the seeded ones: a test can make a stream carry
a given phrase (e.g. a banned one, for the safety post-filter). Several markers emit in order.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Iterator
from itertools import chain

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
GENERATION_PROMPT_TOKENS = 3

_VOCABULARY: tuple[str, ...] = (
    "lorem", "ipsum", "dolor", "sit", "amet", "consec", "tetur", "adip", "iscing", "elit",
    "sed", "do", "eius", "mod", "tempor", "incid", "idunt", "ut", "labore", "et", "dolore",
    "magna", "aliqua", "enim", "ad", "minim", "veniam", "quis", "nostrud", "exerci", "tation",
    "ullam", "co", "laboris", "nisi", "aliquip", "ex", "ea", "commodo", "conse", "quat",
    "duis", "aute", "irure", "in", "repre", "hend", "erit", "volup", "tate", "velit", "esse",
    "cillum", "fugiat", "nulla", "pari", "atur", "excep", "teur", "sint", "occae", "cat",
    "cupi", "datat",
)  # fmt: skip


_EMIT = re.compile(r"\[\[emit:\s*(.*?)\]\]", re.DOTALL)


def scripted_tokens(text: str) -> tuple[str, ...]:
    """The tokens a prompt's ``[[emit: ...]]`` markers ask for (one per word), in order."""
    if "[[emit:" not in text:
        return ()
    return tuple(" " + word for phrase in _EMIT.findall(text) for word in phrase.split())


def output_words(script: tuple[str, ...], seed: int) -> Iterator[str]:
    """The answer's tokens: the scripted ones first, then the seeded pseudo-words."""
    return chain(script, WordStream(seed)) if script else WordStream(seed)


def count_text_tokens(text: str) -> int:
    """Token count of ``text`` under the stand-in tokenizer: ``ceil(len / 4)``, at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def count_chat_tokens(
    contents: list[str],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> int:
    """Token count of a chat prompt whose messages have the given text contents.

    ``continue_final_message`` leaves the final message open (its end token is not counted,
    nor a generation prompt); ``add_generation_prompt=False`` drops the generation prompt.
    """
    body = sum(math.ceil(len(text) / CHARS_PER_TOKEN) for text in contents)
    tokens = body + MESSAGE_OVERHEAD_TOKENS * len(contents)
    if continue_final_message:
        return tokens - 1 if contents else tokens
    return tokens + GENERATION_PROMPT_TOKENS if add_generation_prompt else tokens


def derive_seed(*parts: object) -> int:
    """A stable 64-bit seed from ``parts`` (unlike ``hash()``, the same across processes)."""
    digest = hashlib.sha256("\x1f".join(repr(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class WordStream:
    """An endless, deterministic stream of token texts for one request."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)  # noqa: S311 - simulated text, not cryptography

    def __iter__(self) -> WordStream:
        return self

    def __next__(self) -> str:
        return " " + self._rng.choice(_VOCABULARY)


def embedding_vector(seed: int, dim: int) -> list[float]:
    """A deterministic unit vector of ``dim`` floats for the input that ``seed`` stands for."""
    rng = random.Random(seed)  # noqa: S311 - simulated vectors, not cryptography
    values = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]
