"""An upstream response whose first byte has arrived.

For a stream (``text/event-stream``) the first event is already decoded; :meth:`events`
yields it and every later event's data payload and stops at ``[DONE]``. Any failure after
the first byte raises :class:`StreamBroken` (never a hang: reads are bounded by the
request's deadline and the idle cap). A unary response is read whole before it is handed
out; :meth:`read_json` returns its body.

Closing before the end (``aclose``, leaving ``async with``, or abandoning ``events()``)
closes the connection instead of returning it to the pool, so the engine sees the
disconnect and frees the sequence's KV slot at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import Any, Protocol

import aiohttp
from multidict import CIMultiDictProxy

from runtime.upstream.errors import StreamBroken
from runtime.upstream.sse import DONE, SSEDecoder

# An engine's in-stream error event: vLLM writes ``{"error": {...}}`` (json.dumps spacing);
# older servers ``{"object": "error", ...}``.
_ERROR_EVENT_STARTS = (b'{"error"', b'{"object": "error"', b'{"object":"error"')

BrokenListener = Callable[[StreamBroken], None]
# A chunk's payloads, with the chunk when it is exactly their framing (None otherwise).
Batch = tuple[bytes | None, list[bytes]]


class ReadIdleError(TimeoutError):
    """A raw response's read waited the idle cap without a byte (aiohttp says it with its
    ``SocketTimeoutError``; the lean client with this)."""


# What a failed body read raises (an idle cap, the deadline, a broken connection).
_READ_ERRORS = (aiohttp.SocketTimeoutError, ReadIdleError, TimeoutError, aiohttp.ClientError,
                OSError)  # fmt: skip


class RawContent(Protocol):
    async def readany(self) -> bytes: ...


class RawResponse(Protocol):
    """What this module uses of a client's response: aiohttp's ``ClientResponse`` or the
    lean client's (:class:`runtime.upstream.lean_conn.LeanResponse`)."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> CIMultiDictProxy[str]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def content(self) -> RawContent: ...
    def release(self) -> Any: ...  # aiohttp's returns an awaitable no one awaits
    def close(self) -> None: ...


class EventSource(Protocol):
    """A stream of SSE payloads (an upstream response, a stream that can move to another
    endpoint, a stand-in); :func:`batches_of` reads it by the chunk when it can."""

    def events(self) -> AsyncGenerator[bytes, None]: ...


def batches_of(source: EventSource) -> AsyncGenerator[Batch, None]:
    """``source``'s batches when it has them (``batches()``), else its payloads one by one
    (each without its bytes)."""
    batches = getattr(source, "batches", None)
    return batches() if batches is not None else _one_by_one(source)


async def _one_by_one(source: EventSource) -> AsyncGenerator[Batch, None]:
    async with contextlib.aclosing(source.events()) as events:
        async for payload in events:
            yield None, [payload]


class UpstreamResponse:
    __slots__ = (
        "_body",
        "_consumed",
        "_decoder",
        "_done",
        "_first",
        "_listener",
        "_resp",
        "endpoint_id",
        "status",
    )

    def __init__(
        self,
        resp: RawResponse,
        *,
        endpoint_id: int,
        decoder: SSEDecoder | None = None,
        first_events: list[bytes] | None = None,
        body: bytes | None = None,
    ) -> None:
        self._resp = resp
        self.endpoint_id = endpoint_id
        self.status = resp.status
        self._decoder = decoder
        self._first = first_events or []
        self._body = body
        self._consumed = False
        self._done = body is not None  # a unary body was read to the end
        self._listener: BrokenListener | None = None

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._resp.headers

    @property
    def is_stream(self) -> bool:
        return self._decoder is not None

    @property
    def done(self) -> bool:
        """True once the response was read to its end (``[DONE]`` for a stream)."""
        return self._done

    @property
    def closed(self) -> bool:
        return self._resp.closed

    def set_broken_listener(self, listener: BrokenListener | None) -> None:
        """Call ``listener`` with the error when the stream breaks (used for breakers)."""
        self._listener = listener

    async def events(self) -> AsyncGenerator[bytes, None]:
        """Each SSE event's data payload, in order, until ``[DONE]`` (not yielded)."""
        async with contextlib.aclosing(self.batches()) as batches:
            async for _raw, payloads in batches:
                for payload in payloads:
                    yield payload

    async def batches(self) -> AsyncGenerator[Batch, None]:
        """The payloads of each chunk read, with the chunk itself when it is exactly their
        framing (``data: <payload>\\n\\n`` each, nothing else, no event split across reads):
        a relay can then forward the engine's bytes as they came. ``[DONE]`` is not yielded
        (a chunk that carries it comes without its bytes); an engine's error event raises
        :class:`StreamBroken` after the payloads before it."""
        if self._decoder is None:
            raise RuntimeError("not a stream: use read_json()")
        if self._consumed:
            raise RuntimeError("events() can be iterated only once")
        self._consumed = True
        decoder = self._decoder
        read = self._resp.content.readany
        try:
            pending, self._first = self._first, []
            raw: bytes | None = None  # the opening events were decoded when it opened
            while True:
                if pending:
                    for index, payload in enumerate(pending):
                        if payload == DONE or payload.startswith(_ERROR_EVENT_STARTS):
                            if index:
                                yield None, pending[:index]
                            if payload == DONE:
                                self._finish()
                                return
                            # vLLM reports a failure inside the stream (its engine core
                            # died, a generation error): classified like any other break,
                            # so the client hears our terminal event, not the engine's shape.
                            raise self._broken(
                                f"the engine reported an error mid-stream: {payload[:300]!r}",
                                "engine_error",
                            )
                    yield raw, pending
                try:  # inline, not a coroutine of its own: this runs once per chunk
                    chunk = await read()
                except _READ_ERRORS as exc:
                    raise self._read_failed(exc) from exc
                if not chunk:
                    raise self._broken("upstream ended the stream without [DONE]", "truncated")
                raw, pending = decoder.feed_framed(chunk)
        finally:
            if not self._done:
                self.close()

    async def read_json(self) -> bytes:
        """The whole body of a unary response (already read when the response was opened)."""
        if self._body is None:
            raise RuntimeError("a stream has no single body: use events()")
        return self._body

    def close(self) -> None:
        """Release the connection if the response was read to its end, else close it."""
        if self._done:
            self._resp.release()
        else:
            self._resp.close()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _finish(self) -> None:
        self._done = True
        self._resp.release()

    def _read_failed(self, exc: BaseException) -> StreamBroken:
        """The break a failed read is (``exc`` is one of :data:`_READ_ERRORS`)."""
        if isinstance(exc, (aiohttp.SocketTimeoutError, ReadIdleError)):
            return self._broken("no bytes from upstream within the idle cap", "stalled")
        if isinstance(exc, TimeoutError):
            return self._broken("the request deadline passed mid-stream", "deadline")
        return self._broken(f"upstream stream failed: {exc!r}", "disconnected")

    def _broken(self, message: str, reason: str) -> StreamBroken:
        error = StreamBroken(message, reason=reason, endpoint_id=self.endpoint_id)
        if self._listener is not None:
            self._listener(error)
        return error
