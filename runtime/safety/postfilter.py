"""The streaming post-filter: stop an answer at the first ``stop`` match, across chunk boundaries.

:class:`StreamFilter` is one per stream. The relay feeds it each chunk's text delta; it scans
the delta plus the last ``window`` characters it has seen (``window`` = the longest match any
stop rule can make), so a phrase split over chunks is caught as soon as its last character
arrives, and the work per chunk is O(delta + window), not O(answer).

A match that ends exactly at the end of what has arrived and ends in a word character is held
back until the next delta (or :meth:`StreamFilter.finish`): ``bad`` at the end of a chunk may
be the start of ``badge``, and a card number may have digits still to come. So a stop comes
at most one chunk after the match completes.

On a stop, :class:`Stop` says which pack and rule, and ``emit``: the part of the current delta
before the match, which the relay may still send before it ends the stream with
``finish_reason: "content_filter"`` and cancels the upstream. Text of a match that began in an
earlier chunk has already been sent; only holding output back could avoid that.

:func:`check_text` is the unary check, for a whole answer before it is sent (or replayed from
the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.safety.compiled import CompiledPack, Hit, Matcher


@dataclass(frozen=True, slots=True)
class Stop:
    pack: str
    rule: str
    label: str
    emit: str = ""  # the part of the last delta before the match (safe to send)


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def check_text(packs: Sequence[CompiledPack], text: str) -> Stop | None:
    """The first stop rule (pack order) that matches the whole answer ``text``."""
    for pack in packs:
        hit = pack.stop.first(text)
        if hit is not None:
            return Stop(hit.pack, hit.rule, hit.label, text[: hit.start])
    return None


class StreamFilter:
    """Feed text deltas in order; the first :class:`Stop` ends the stream."""

    __slots__ = ("_matchers", "_tail", "_window", "stopped")

    def __init__(self, packs: Sequence[CompiledPack]) -> None:
        self._matchers: tuple[Matcher, ...] = tuple(
            p.stop for p in packs if p.stop.active
        )
        self._window = max((m.max_len for m in self._matchers), default=0)
        self._tail = ""  # the last window + 1 characters (one of left context for \b)
        self.stopped: Stop | None = None

    @property
    def active(self) -> bool:
        """False when there is nothing to check (no stop rules): the relay can skip it."""
        return bool(self._matchers)

    def feed(self, delta: str) -> Stop | None:
        """Check one chunk's text; the stop, if this (or an earlier) chunk completed a match."""
        if self.stopped is not None or not self._matchers or not delta:
            return self.stopped
        return self._scan(delta, final=False)

    def finish(self) -> Stop | None:
        """The end of the stream: a match held back at the very end is decided now."""
        if self.stopped is not None or not self._matchers:
            return self.stopped
        return self._scan("", final=True)

    def _scan(self, delta: str, *, final: bool) -> Stop | None:
        tail = self._tail
        text = tail + delta
        # The tail's first character is left context only, once the tail is full.
        pos = 1 if len(tail) > self._window else 0
        for matcher in self._matchers:
            hit = self._first(matcher, text, pos, final)
            if hit is not None:
                emit = delta[: max(0, hit.start - len(tail))]
                self.stopped = Stop(hit.pack, hit.rule, hit.label, emit)
                return self.stopped
        self._tail = text[-(self._window + 1) :]
        return None

    @staticmethod
    def _first(matcher: Matcher, text: str, pos: int, final: bool) -> Hit | None:
        if not matcher.maybe(text, pos):
            return None
        end = len(text)
        for hit in matcher.hits(text, pos):
            if not final and hit.end == end and _word(text[end - 1]):
                continue  # it may go on in the next delta: decide then
            return hit
        return None
