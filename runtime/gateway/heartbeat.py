"""Heartbeats for a stream that waits in its pool's queue.

A streaming request that has to wait for an endpoint (not one that goes straight to one)
gets its response headers the moment the dispatcher queues it, then an SSE comment
``: queued position=<n>`` (``: queued`` once its position is no longer known) at once and
every ``interval_s`` while it waits, so proxies and clients that cut idle connections keep
it. SSE clients ignore comment lines; the OpenAI clients skip them.

:class:`QueuedStream` is also the sink the later stages send through: once the heartbeats
started the response, the relay's own ``start_response`` is not sent again (the headers
already went out, the same ones), and a failure after that point (the queue's deadline, a
shed, an upstream that refuses) can no longer be an HTTP status: :meth:`QueuedStream.fail`
ends the stream with the relay's terminal error chunk (``finish_reason: "error"`` and the
OpenAI-style ``error`` object) and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

from runtime.gateway.errors import ApiError
from runtime.gateway.relay import ResponseSink, end_cut, end_with_error

Headers = Iterable[tuple[bytes, bytes]]
MAX_INTERVAL_S = 5.0  # the bound: every 5 s at most
DEFAULT_INTERVAL_MS = 5000  # a request without a class
STOP_WAIT_S = 1.0  # the most a beat being written may hold up the request's next step


def comment(position: int | None) -> bytes:
    """One heartbeat: an SSE comment line and the blank line that ends the event."""
    if position is None:
        return b": queued\n\n"
    return b": queued position=%d\n\n" % position


class QueuedStream:
    """The response of a streaming request while (and after) it waits in the queue."""

    __slots__ = (
        "_headers", "_interval", "_kind", "_model", "_position", "_sending", "_sink",
        "_stopping", "_task", "beats", "ended", "started",
    )  # fmt: skip

    def __init__(
        self, sink: ResponseSink, *, interval_s: float, headers: Headers, kind: str, model: str
    ) -> None:
        self._sink = sink
        self._interval = min(interval_s, MAX_INTERVAL_S)
        self._headers = list(headers)
        self._kind = kind
        self._model = model
        self._position: Callable[[], int | None] = lambda: None
        self._task: asyncio.Task[None] | None = None
        self._sending = False
        self._stopping = False
        self.beats = 0
        self.started = False  # the response's headers went out
        self.ended = False  # its last chunk went out

    # -- the sink the later stages send through ---------------------------------------------

    async def start_response(self, status: int, headers: Headers) -> None:
        if self.started:
            return  # the heartbeats sent the same headers already
        self.started = True
        await self._sink.start_response(status, headers)

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        if last:
            self.ended = True
        await self._sink.send_chunk(data, last=last)

    # -- the heartbeats -------------------------------------------------------------------

    def queued(self, position: Callable[[], int | None]) -> None:
        """The dispatcher queued the request (``Ticket.on_queued``): beat until :meth:`stop`."""
        self._position = position
        if self._task is None and not self._stopping:
            self._task = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            self._sending = True
            try:
                if not self.started:
                    self.started = True
                    await self._sink.start_response(200, self._headers)
                await self._sink.send_chunk(comment(self._position()))
                self.beats += 1
            except OSError:  # the client is gone: its disconnect cancels the request
                return
            finally:
                self._sending = False
            if self._stopping:
                return
            await asyncio.sleep(self._interval)

    async def stop(self) -> None:
        """No more heartbeats (the wait ended, either way); a beat being written finishes
        first, so later chunks never interleave with it."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        if not self._sending:
            task.cancel()
        done, _ = await asyncio.wait([task], timeout=STOP_WAIT_S)
        if not done:  # a beat stuck on a client that does not read: give up on it
            task.cancel()
            await asyncio.wait([task])

    async def fail(self, error: BaseException, cut_reason: str | None) -> None:
        """The request failed after the heartbeats started the response: end the stream with
        the terminal error chunk and ``[DONE]`` (the relay ends its own failures; a client
        that went away gets nothing more)."""
        await self.stop()
        if not self.started or self.ended:
            return
        if isinstance(error, asyncio.CancelledError):
            if cut_reason is None:
                return
            with contextlib.suppress(OSError):
                await end_cut(self, kind=self._kind, reason=cut_reason, model=self._model)
            return
        failure = error if isinstance(error, ApiError) else ApiError.of("internal_error")
        with contextlib.suppress(OSError):
            await end_with_error(self, kind=self._kind, failure=failure, model=self._model)
