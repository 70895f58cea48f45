"""Incremental Server-Sent Events decoder: bytes in any chunking → each event's data.

Follows the WHATWG event-stream rules that matter for relaying: lines end with LF, CRLF
or a lone CR (a CRLF split across two chunks counts once); a blank line ends an event;
``data`` lines (one optional space after the colon) are joined with LF; comments (``:``)
and other fields (``event``, ``id``, ``retry``) are ignored; an event without data lines
is not dispatched; a leading UTF-8 BOM is skipped. Chunk boundaries never change the
result. The fast path (LF-only streams, as vLLM writes them) is one ``split`` per chunk;
:meth:`SSEDecoder.feed_framed` takes a chunk of whole ``data: `` events without parsing its
lines, and says so (a relay forwards such a chunk as it came).
"""

from __future__ import annotations

_BOM = b"\xef\xbb\xbf"
DONE = b"[DONE]"


class SSEDecoder:
    """Feed it chunks; it returns the data payloads of the events those chunks complete."""

    __slots__ = ("_buf", "_data", "_pending_cr", "_started")

    def __init__(self) -> None:
        self._buf = b""  # an incomplete last line
        self._data: list[bytes] = []  # data lines of the event being read
        self._pending_cr = False  # the previous chunk ended in CR: drop a leading LF
        self._started = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if not chunk:
            return []
        if not self._started:
            if len(self._buf) + len(chunk) < len(_BOM) and _BOM.startswith(self._buf + chunk):
                self._buf += chunk  # could still be a BOM split across chunks
                return []
            chunk = self._buf + chunk
            self._buf = b""
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[len(_BOM) :]
        if self._pending_cr:
            self._pending_cr = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._pending_cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = (self._buf + chunk).split(b"\n")
        self._buf = lines.pop()
        events: list[bytes] = []
        for line in lines:
            self._line(line, events)
        return events

    def feed_framed(self, chunk: bytes) -> tuple[bytes | None, list[bytes]]:
        """:meth:`feed`, with ``chunk`` itself when it is exactly ``data: <payload>\\n\\n``
        for each event it completes, read from an event boundary (what a relay can forward
        as it came); None otherwise. Such a chunk (vLLM writes one event per write) skips
        the line parser.

        With LF-only lines, ``2 n`` line ends in a chunk split into ``n`` parts at blank lines
        leave each part one line: a data line when it starts with ``data: ``."""
        if (
            not self._buf and not self._data and not self._pending_cr
            and chunk.startswith(b"data: ") and chunk.endswith(b"\n\n") and b"\r" not in chunk
        ):  # fmt: skip
            self._started = True  # (a chunk that starts with "data: " has no BOM)
            lines = chunk.count(b"\n")
            if lines == 2:
                return chunk, [chunk[6:-2]]
            parts = chunk[:-2].split(b"\n\n")
            if lines == 2 * len(parts) and all(p.startswith(b"data: ") for p in parts):
                return chunk, [p[6:] for p in parts]
        return None, self.feed(chunk)

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data = []
            return
        if line.startswith(b"data"):
            if line.startswith(b"data: "):
                self._data.append(line[6:])
            elif line.startswith(b"data:"):
                self._data.append(line[5:])
            elif line == b"data":
                self._data.append(b"")
            # anything else ("database: x") is a different field name: ignored

    @property
    def pending(self) -> bool:
        """True if bytes of an unfinished event are buffered (the stream was cut short)."""
        return bool(self._buf or self._data)
