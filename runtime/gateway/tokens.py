"""Prompt token counts for the context caps, cheap first and exact only when it matters.

A byte-level BPE token covers at least one UTF-8 byte (SentencePiece with byte fallback and
WordPiece likewise), so ``bytes + overhead`` bounds the count from above for free; the
overhead allows for the chat template's role and marker tokens and the special tokens a
tokenizer adds. Only when that bound is over the cap do we count with the version's own
tokenizer (``tokenizer.json`` found through ``VersionSnap.tokenizer`` or the artifact
directory), loaded once per version in a thread and kept in a small LRU. With no tokenizer
the bound stands and the error says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import msgspec

from runtime.routing.prefix import CHARS_PER_TOKEN
from runtime.snapshot import VersionSnap

logger = logging.getLogger(__name__)

REQUEST_OVERHEAD = 8  # BOS/EOS and the generation prompt of a chat template
MESSAGE_OVERHEAD = 8  # per chat message: role markers around the role name
TOKENIZER_FILE = "tokenizer.json"


class TokenCount(msgspec.Struct, frozen=True):
    tokens: int
    exact: bool  # False: an upper bound from byte lengths


def text_overheads(texts: Sequence[str], roles: Sequence[str] | None) -> list[int]:
    """Per-text allowance: a chat message pays for its role and markers."""
    if roles is None:
        return [0] * len(texts)
    return [MESSAGE_OVERHEAD + len(role) for role in roles]


def byte_bound(texts: Sequence[str], overheads: Sequence[int]) -> int:
    return REQUEST_OVERHEAD + sum(
        len(text.encode("utf-8", "surrogatepass")) + extra
        for text, extra in zip(texts, overheads, strict=True)
    )


def prefill_estimate(count: TokenCount, texts: Sequence[str], overheads: Sequence[int]) -> int:
    """The prompt's tokens as the engine will prefill them: ``count`` when exact, else the
    characters over ``CHARS_PER_TOKEN`` (the router's rule of thumb) plus the overheads. The
    byte bound is about 4x that on English text: a cost estimate (the dispatcher's prefill
    pacing and victim choice) must not use it (issue #34)."""
    if count.exact:
        return count.tokens
    pairs = zip(texts, overheads, strict=True)
    return REQUEST_OVERHEAD + sum(-(-len(text) // CHARS_PER_TOKEN) + extra for text, extra in pairs)


def _local_path(uri: str) -> Path | None:
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and uri[1:2] == ":"):
        return Path(uri)
    return None  # remote artifacts: never fetched on the request path


def tokenizer_path(version: VersionSnap) -> Path | None:
    """Where the version's ``tokenizer.json`` is, if it is on this machine (blocking I/O)."""
    for base in (_local_path(version.tokenizer), _local_path(version.artifact_uri)):
        if base is None:
            continue
        candidate = base if base.is_file() else base / TOKENIZER_FILE
        if candidate.is_file():
            return candidate
    return None


def _load(version: VersionSnap) -> Any:
    """The version's tokenizer, or None (logged once per load attempt)."""
    try:
        path = tokenizer_path(version)
        if path is None:
            logger.warning("tokens: version %d has no local %s", version.id, TOKENIZER_FILE)
            return None
        from tokenizers import Tokenizer  # noqa: PLC0415 - heavy import, only when needed

        return Tokenizer.from_file(str(path))
    except Exception:
        logger.exception("tokens: cannot load the tokenizer of version %d", version.id)
        return None


class TokenCounter:
    """Counts prompt tokens per model version; one per router process."""

    def __init__(self, *, cache_size: int = 8) -> None:
        self._cache_size = max(cache_size, 1)
        self._tokenizers: OrderedDict[int, asyncio.Task[Any]] = OrderedDict()

    async def tokenizer(self, version: VersionSnap) -> Any:
        """The version's ``tokenizers.Tokenizer``, or None when none can be loaded."""
        task = self._tokenizers.get(version.id)
        if task is None:
            task = asyncio.create_task(asyncio.to_thread(_load, version))
            self._tokenizers[version.id] = task
            while len(self._tokenizers) > self._cache_size:
                self._tokenizers.popitem(last=False)
        else:
            self._tokenizers.move_to_end(version.id)
        return await asyncio.shield(task)

    async def exact(
        self, version: VersionSnap, texts: Sequence[str], overheads: Sequence[int]
    ) -> TokenCount | None:
        """Count with the version's tokenizer; None when it has none."""
        tokenizer = await self.tokenizer(version)
        if tokenizer is None:
            return None
        encodings = await asyncio.to_thread(
            tokenizer.encode_batch, list(texts), add_special_tokens=False
        )
        tokens = REQUEST_OVERHEAD + sum(
            len(encoding.ids) + extra for encoding, extra in zip(encodings, overheads, strict=True)
        )
        return TokenCount(tokens, exact=True)

    async def count(
        self,
        version: VersionSnap,
        texts: Sequence[str],
        overheads: Sequence[int],
        *,
        budget: int,
    ) -> TokenCount:
        """The bound when it fits ``budget``, else the exact count (or the bound without one)."""
        bound = TokenCount(byte_bound(texts, overheads), exact=False)
        if bound.tokens <= budget:
            return bound
        return await self.exact(version, texts, overheads) or bound
