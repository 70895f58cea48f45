"""The router's request ids: what ``X-Request-Id`` says when the client sent none (or one that
is not sane).

An id is 32 lowercase hex characters, as a ``uuid4().hex`` was: a random 64-bit prefix drawn
once per router process (per :class:`RequestIds`, one per app) and a 64-bit counter. What an id
must be: unique among the router's requests (the ids name requests in logs, traces, usage
events, intervention records; none of them is a key: a client may send its own, so they are not
unique there anyway) and safe in a header. It need not be unguessable: no lookup takes a
request id as a credential. Two router processes share an id only if their prefixes are equal
(a chance of 2^-64 per pair). One id is a counter step and a format, not 16 bytes from
``os.urandom`` and a ``UUID`` (issue #27: ~0.2 µs against ~2 µs).
"""

from __future__ import annotations

import itertools
import secrets


class RequestIds:
    """Fresh request ids for one router process (see the module docstring)."""

    __slots__ = ("_counter", "_prefix")

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"
