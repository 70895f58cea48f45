"""A streamed response's head written straight to uvicorn's httptools cycle (issue #27).

uvicorn's ``RequestResponseCycle.send`` checks each header of a response head on its own: two
regular-expression searches, a ``lower()`` and three comparisons per header (26 searches for
the router's 13-header stream head), inside a coroutine of its own. :func:`write_head` writes
the same bytes and leaves the cycle in the same state with one pass over the names joined and
one over the values joined (the expressions are classes of single bytes, so the joined
names hold a refused byte exactly when one name does; the pass deletes those bytes with
``bytes.translate`` and compares the lengths) and no coroutine.

It handles only the common case and says so by returning False, for the caller to use the
server's ``send`` as before: a head whose names are all lower case, with none of
``content-length``, ``transfer-encoding`` or ``connection`` (whose values uvicorn reads), a
status uvicorn knows, and a cycle that has not started its response, is not paused for
flow control, not disconnected and keeps no access log. An invalid name or value falls back
too, so uvicorn raises its own error. :func:`cycle_of` finds the cycle behind a server's
``send`` (None for any other server: h11, a test's stand-in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

# The bytes uvicorn's HEADER_RE / HEADER_VALUE_RE refuse in a name / value: a header is valid
# when deleting them (``bytes.translate``, one C pass) leaves it whole (a test checks every
# byte against the expressions).
BAD_NAME_BYTES = bytes(b for b in range(256) if HEADER_RE.search(bytes([b])))
BAD_VALUE_BYTES = bytes(b for b in range(256) if HEADER_VALUE_RE.search(bytes([b])))
_READ_BY_UVICORN = frozenset((b"content-length", b"transfer-encoding", b"connection"))
_NO_BODY_STATUSES = (204, 304)
_SEND = RequestResponseCycle.send


def cycle_of(send: Callable[..., Any]) -> RequestResponseCycle | None:
    """The httptools cycle whose bound ``send`` this is, or None."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is RequestResponseCycle and getattr(send, "__func__", None) is _SEND:
        return cycle
    return None


def write_head(
    cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]]
) -> bool:
    """Write the response head as ``cycle.send`` would for ``http.response.start``; False
    (nothing written, nothing changed) when this is not the common case above."""
    if cycle.response_started or cycle.disconnected or cycle.access_log:
        return False
    if cycle.flow.write_paused:
        return False
    line = STATUS_LINE.get(status)
    every = cycle.default_headers + headers
    if line is None or not every:
        return False
    names, values = zip(*every, strict=True)
    joined = b"".join(names)
    joined_values = b"".join(values)
    if (
        len(joined.translate(None, BAD_NAME_BYTES)) != len(joined)
        or len(joined_values.translate(None, BAD_VALUE_BYTES)) != len(joined_values)
        or joined.lower() != joined
        or not _READ_BY_UVICORN.isdisjoint(names)
    ):
        return False
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    content = [line, b"\r\n".join(map(b": ".join, every)), b"\r\n"]
    if not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    if cycle.scope["method"] != "HEAD" and status not in _NO_BODY_STATUSES:
        cycle.chunked_encoding = True
        content.append(b"transfer-encoding: chunked\r\n")
    content.append(b"\r\n")
    cycle.transport.write(b"".join(content))
    return True
