"""The base consumer: one request's ASGI HTTP exchange, without a framework.

A consumer is made per request by the HTTP entry (:mod:`runtime.gateway.routes`, or the
Channels flavour of :mod:`runtime.gateway.channels_http`, which mixes Channels'
``AsyncHttpConsumer`` in below it and changes nothing of what follows). A handler that awaited
its answer inside the receive loop would leave the ASGI ``receive`` channel unread while a
response streams, and ``http.disconnect`` would never be seen (DESIGN §4.1 step 7). Here,
once the body is complete, the handler runs as its own task and
``http_request`` returns; the receive loop then waits on the next message, which is
``http.disconnect`` — either the client going away (the task is cancelled at once, which
aborts the upstream request) or uvicorn reporting the response complete (the task is
already done). Either way the consumer then stops. When uvicorn cancels the request itself
(the router's SIGTERM grace period is over), the handler is cancelled with ``cut_reason``
``router_shutdown``: a stream ends with that terminal event and ``[DONE]``, a request not yet
answered gets a 503 ``router_shutdown``. A body still incomplete after the
router's ``body_timeout_s`` is answered 408 ``request_timeout`` and its connection closed. A
response chunk that waits longer than ``client_write_stall_s`` for a client that stopped
reading drops the connection: the request ends as the client's disconnect (under uvicorn's
httptools cycle; elsewhere the send is unbounded).

Per request this consumer makes no channel-layer call and no database thread hop, in either
flavour: it never builds a channel layer (whatever ``CHANNEL_LAYERS`` says) and it never
runs Channels' ``aclose_old_connections``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from runtime.gateway.errors import ApiError
from runtime.gateway.head_write import cycle_of, write_head
from runtime.gateway.request_ids import RequestIds
from runtime.gateway.state import STATE_KEY, RouterState

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

logger = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_REQUEST_ID_RE = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
JSON_HEADERS: tuple[tuple[bytes, bytes], ...] = ((b"content-type", b"application/json"),)
_CLOSE: tuple[tuple[bytes, bytes], ...] = ((b"connection", b"close"),)
ROUTER_SHUTDOWN = "router_shutdown"
CUT_WAIT_S = 2.0  # the cut handler's last writes; bounded, the router is exiting


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def request_id_for(scope: Scope, ids: RequestIds) -> str:
    """The client's ``X-Request-Id`` when it is sane, else a fresh one from ``ids``."""
    given = header(scope, b"x-request-id")
    if given is not None and _REQUEST_ID_RE.fullmatch(given):
        return given.decode("ascii")
    return ids.next()


HOOK_KEY = "switchyard.connection"  # the scope key of the server's ConnectionHook


class ConnectionHook:
    """What a server that supports it (:mod:`runtime.gateway.http_protocol`) puts in a
    request's scope: it calls ``on_lost`` when the connection is lost before the response
    completed, sets ``shutting_down`` when the server starts its shutdown, and sets
    ``body_complete`` when it has parsed the request's whole body (then the consumer reads it
    with no time bound: nothing is left to wait for). With it a consumer answers in the
    server's task (see :meth:`GatewayConsumer._inline`)."""

    __slots__ = ("body_complete", "on_lost", "shutting_down")

    def __init__(self) -> None:
        self.on_lost: Callable[[], None] | None = None
        self.shutting_down = False
        self.body_complete = False  # the server has the whole body: reading it cannot stall

    def lost(self) -> None:
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()


class StopConsumer(Exception):  # noqa: N818 - Channels' name for the same thing
    """Raised by a message handler: this request's exchange is over."""


class GatewayConsumer(metaclass=abc.ABCMeta):
    """Base of every route. Subclasses implement :meth:`respond` (run as a task)."""

    methods: ClassVar[tuple[str, ...]] = ("GET",)
    reads_body: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # Channels' AsyncHttpConsumer in that flavour
        self.scope: Scope = {}
        self.body: list[bytes] = []
        self._task: asyncio.Task[None] | None = None
        self._received = 0
        self.request_id = ""
        self.response_started = False
        self.response_finished = False
        self.cut_reason: str | None = None  # set when the router itself ends the request
        self.client_gone = False  # inline: the server reported the connection lost
        self._timed_out = False  # inline: the body timed out
        self._hook: ConnectionHook | None = None  # inline: the server's connection hook
        self._cycle: RequestResponseCycle | None = None  # uvicorn's, behind ``base_send``
        self._inline_task: asyncio.Task[Any] | None = None  # inline: the task answering

    # -- the ASGI loop, without a channel layer -------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.channel_layer = None  # never touch Redis for one (the Channels flavour)
        self.base_send = send
        self._cycle = cycle_of(send)
        self.request_id = request_id_for(scope, self.state.request_ids)
        if (early := self.early_error(scope)) is not None:
            await self.refuse(early)
            return
        hook = scope.get(HOOK_KEY)
        if isinstance(hook, ConnectionHook):
            await self._inline(hook, receive)
            return
        timer = asyncio.get_running_loop().call_later(
            self.state.config.body_timeout_s, self._body_timed_out
        )
        try:
            with contextlib.suppress(StopConsumer):
                while True:  # one receive channel: no per-message task (await_many_dispatch)
                    await self.dispatch(await receive())
        except asyncio.CancelledError:
            await self._cut(ROUTER_SHUTDOWN)
            raise
        finally:
            timer.cancel()

    # -- one task per request: the server tells us of a lost connection --------------------

    async def _inline(self, hook: ConnectionHook, receive: Receive) -> None:
        """The request in the server's own task: the body is read here, then the handler runs
        here too (no handler task, no receive loop). A lost connection cancels this task
        through ``hook`` (``client_gone``); a body still incomplete after ``body_timeout_s``
        cancels it too (408: timed only when the server did not have the whole body when this
        task began); any other cancel is the server's shutdown cut."""
        task = asyncio.current_task()
        assert task is not None
        self._hook = hook
        timer = None  # the body is in the server's hands already (the usual case): no bound
        if not hook.body_complete:
            timer = asyncio.get_running_loop().call_later(
                self.state.config.body_timeout_s, self._inline_timed_out, task
            )
        try:
            body = await self._read_body(receive)
            if timer is not None:
                timer.cancel()
            if body is None:
                return
            self._inline_task = task
            hook.on_lost = self._inline_lost  # a bound method: no closure per request
            await self._respond_safely(body)
        except asyncio.CancelledError:
            if self._timed_out or self.client_gone:
                task.uncancel()
                if self._timed_out:
                    await self._refuse_timed_out()
                return
            await self._cut(ROUTER_SHUTDOWN)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            hook.on_lost = None
            self._inline_task = None

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None when the request ended first (gone, or refused: 413)."""
        cap = self.body_cap()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # http.disconnect: the client went away
            chunk: bytes = message.get("body", b"")
            self._received += len(chunk)
            if self._received > cap:
                self.body.clear()
                await self.refuse(self.too_large(cap))
                return None
            if chunk:
                self.body.append(chunk)
            if not message.get("more_body"):
                body = b"".join(self.body)
                self.body.clear()
                return body

    def _inline_lost(self) -> None:
        self.client_gone = True
        if self._inline_task is not None:
            self._inline_task.cancel()

    def _inline_timed_out(self, task: asyncio.Task[Any]) -> None:
        self._timed_out = True
        task.cancel()

    def current_cut(self) -> str | None:
        """The reason the router is cutting this request, or None (the client went away, or
        nothing is cut). Inline, a cancel nobody else claimed during the server's shutdown is
        the cut, before :meth:`_cut` has set the reason."""
        if self.cut_reason is not None or self._hook is None or self.client_gone:
            return self.cut_reason
        if not self._hook.shutting_down:  # the usual case: no task lookup (a getpid on 3.11)
            return None
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            return ROUTER_SHUTDOWN
        return None

    async def _cut(self, reason: str) -> None:
        """uvicorn cancelled this request: the router's SIGTERM grace period is over. The
        handler task is cancelled with ``cut_reason`` set, so a running stream ends with our
        terminal event and ``[DONE]``; a request not yet answered gets the 503 ``reason``."""
        task, self._task = self._task, None
        self.cut_reason = reason
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=CUT_WAIT_S)
        if not self.response_started:
            with contextlib.suppress(OSError, RuntimeError):  # the client may be gone too
                await self.send_error(ApiError.of(reason, headers=_CLOSE))

    async def dispatch(self, message: dict[str, Any]) -> None:
        # (Channels' own dispatch first runs close_old_connections in a thread; we hold no DB.)
        kind = message["type"]
        if kind == "http.request":
            await self.http_request(message)
        elif kind == "http.disconnect":
            await self.http_disconnect(message)
        else:
            raise ValueError(f"No handler for message type {kind}")

    @property
    def state(self) -> RouterState:
        state: RouterState = self.scope["state"][STATE_KEY]
        return state

    def early_error(self, scope: Scope) -> ApiError | None:
        """Refusals decided from the request line and headers alone (before any body)."""
        if scope.get("method") not in self.methods:
            return ApiError.of(
                "method_not_allowed", method=scope.get("method"), allowed=", ".join(self.methods)
            )
        length = header(scope, b"content-length")
        cap = self.body_cap()
        if length is not None and length.isdigit() and int(length) > cap:
            return self.too_large(cap)
        return None

    def _body_timed_out(self) -> None:
        """The body is still incomplete after ``body_timeout_s``: 408, and the connection
        closes (the rest of the body is never read)."""
        if self._task is not None:
            return  # the body is complete: the handler runs (or ran)
        self._start(self._refuse_timed_out())

    async def _refuse_timed_out(self) -> None:
        self.body.clear()
        seconds = f"{self.state.config.body_timeout_s:g}"
        await self.refuse(ApiError.of("request_timeout", seconds=seconds, headers=_CLOSE))

    def body_cap(self) -> int:
        """The most body bytes this route reads (413 above): the router's request cap."""
        return self.state.config.max_body_bytes

    @staticmethod
    def too_large(cap: int) -> ApiError:
        return ApiError.of("request_too_large", cap=cap)

    async def http_request(self, message: dict[str, Any]) -> None:
        if self._task is not None:
            return  # more body after we already answered (413): ignored
        chunk: bytes = message.get("body", b"")
        self._received += len(chunk)
        cap = self.body_cap()
        if self._received > cap:
            self.body.clear()
            self._start(self.refuse(self.too_large(cap)))
            return
        if chunk:
            self.body.append(chunk)
        if not message.get("more_body"):
            body = b"".join(self.body)
            self.body.clear()
            self._start(self._respond_safely(body))

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        """Client gone or response complete: cancel the handler if it still runs, stop."""
        task, self._task = self._task, None
        if task is not None and not task.done():  # done: the common case, nothing to wait for
            task.cancel()
            await asyncio.wait([task])
        raise StopConsumer

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        self._task = asyncio.create_task(coro, name=f"request-{self.request_id}")

    async def _respond_safely(self, body: bytes) -> None:
        try:
            await self.respond(body)
        except ApiError as exc:
            await self.send_error(exc)
        except Exception:
            logger.exception("request %s failed", self.request_id)
            await self.send_error(ApiError.of("internal_error"))

    @abc.abstractmethod
    async def respond(self, body: bytes) -> None:
        """Answer the request whose complete body is ``body``."""

    async def refuse(self, error: ApiError) -> None:
        """Answer ``error`` without running :meth:`respond` (405, 413, unknown URL)."""
        self.on_refused(error)
        await self.send_error(error)

    def on_refused(self, error: ApiError) -> None:  # noqa: B027 - a hook, empty by default
        """Hook: account for a refusal decided before the handler ran."""

    # -- sending --------------------------------------------------------------------------

    def base_headers(self, extra: Iterable[tuple[bytes, bytes]] = ()) -> Headers:
        return [(b"x-request-id", self.request_id.encode("ascii")), *extra]

    # Straight to the server's ``send``: Channels' send_headers / send_body / send add two
    # coroutine hops per message and nothing this router uses. Under uvicorn's httptools a
    # stream's head is written by :func:`write_head` (the same bytes, fewer checks; issue #27).
    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.response_started = True
        head = self.base_headers(headers)
        cycle = self._cycle
        if cycle is not None and write_head(cycle, status, head):
            return
        await self.base_send({"type": "http.response.start", "status": status, "headers": head})

    def send_chunk(self, data: bytes, *, last: bool = False) -> Awaitable[None]:
        # A chunk that is not the last is the server's send itself: no coroutine of ours.
        sending: Awaitable[None]
        if last:
            sending = self._send_last(data)
        else:
            body = {"type": "http.response.body", "body": data, "more_body": True}
            sending = self.base_send(body)
        cycle = self._cycle
        if cycle is not None and cycle.flow.write_paused:
            return self._bounded(sending)
        return sending

    async def _bounded(self, sending: Awaitable[None]) -> None:
        """A chunk for a client that has stopped reading: uvicorn paused writing (the client's
        socket and the transport's buffer are full) and its ``send`` waits for the client to
        read. It waits at most ``client_write_stall_s``; then the connection is dropped, which
        ends the request as the client's disconnect (the handler is cancelled; the slot, the
        escrow and the record settle as for any disconnect), instead of holding the request,
        its concurrency slot and its upstream stream until the deadline."""
        timer = asyncio.get_running_loop().call_later(
            self.state.config.client_write_stall_s, self._drop_stalled
        )
        try:
            await sending
        finally:
            timer.cancel()

    def _drop_stalled(self) -> None:
        cycle = self._cycle
        if cycle is None or cycle.disconnected:
            return
        logger.warning("request %s: a chunk waited %gs for the client to read; connection dropped",
                       self.request_id, self.state.config.client_write_stall_s)  # fmt: skip
        cycle.transport.abort()  # close() would wait to flush what the client never reads

    async def _send_last(self, data: bytes) -> None:
        await self.base_send({"type": "http.response.body", "body": data, "more_body": False})
        self.response_finished = True

    async def send_json(
        self, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        length = (b"content-length", str(len(body)).encode("ascii"))
        await self.start_response(status, [*JSON_HEADERS, length, *headers])
        await self.send_chunk(body, last=True)

    async def send_error(self, error: ApiError) -> None:
        """The error as OpenAI JSON; if a response already started, just end it."""
        if self.response_finished:
            return
        if self.response_started:
            await self.send_chunk(b"", last=True)
            return
        await self.send_json(error.status, error.body(), error.headers)
