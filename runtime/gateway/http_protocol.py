"""uvicorn's httptools protocol with a bound on the request head and OpenAI-shaped refusals.

uvicorn buffers a request's URL and headers without limit, and without a time limit, under
httptools. Here the request line plus headers may hold :data:`MAX_HEAD_BYTES`; past that the
client gets a 431 ``headers_too_large`` and the connection closes, before any of it reaches
the app. A head still incomplete after the router's ``body_timeout_s`` (a slow-loris client)
gets a 408 ``request_timeout`` and the connection closes (the body's own bound is the
consumer's). The head's bound is one timer per connection, not one per request: a request's
head marks when it began, and the timer, when it fires, refuses the head in progress if it
is due, re-arms for one that began later, or lapses when none is being read (the next head
arms it again). A request the parser cannot read (a malformed request line, bad chunked framing)
gets uvicorn's 400, but as an OpenAI error document (``bad_http_request``), not plain text.

Each request's scope also carries a :class:`~runtime.gateway.consumers.ConnectionHook`: the
protocol tells it when the connection is lost before the response completed and when the
server begins its shutdown, so a consumer answers in the request's own task, with no handler
task and no receive loop beside it (issue #27: one task per request); it also tells it when the
request's whole body has been parsed (a body that came with its head needs no body timer).
Under HTTPS a connection's writes go through
:class:`~runtime.gateway.coalesce.CoalescingTransport` (what one event-loop turn writes is one
write: one TLS record); plain HTTP connections write as uvicorn does.

Used by ``python -m runtime.gateway`` (``http=BoundedHttpToolsProtocol``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from runtime.gateway.coalesce import CoalescingTransport
from runtime.gateway.consumers import HOOK_KEY, ConnectionHook
from runtime.gateway.errors import ApiError
from runtime.gateway.state import STATE_KEY

MAX_HEAD_BYTES = 64 * 1024  # request line + headers; nginx allows 32 KiB, Go 1 MiB
DEFAULT_HEAD_TIMEOUT_S = 30.0  # when the app's state (and its config) is not there


class HeadTooLargeError(Exception):
    """Raised inside a parser callback; the parser wraps it in HttpParserCallbackError."""


def _status_line(status: int) -> bytes:
    line = STATUS_LINE.get(status)
    if line is not None:
        return line
    return f"HTTP/1.1 {status} Request Header Fields Too Large\r\n".encode("ascii")


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """See the module docstring."""

    max_head_bytes = MAX_HEAD_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._head_too_large = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since: float | None = None  # when the head being read began; None: none
        self._hooks: list[ConnectionHook] = []  # requests not yet answered, oldest first

    def _head_timeout_s(self) -> float:
        state = self.app_state.get(STATE_KEY)
        config = getattr(state, "config", None)
        return float(getattr(config, "body_timeout_s", DEFAULT_HEAD_TIMEOUT_S))

    def _head_begins(self) -> None:
        self._head_since = self.loop.time()
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._head_timeout_s(), self._head_check)

    def _head_ends(self) -> None:
        self._head_since = None  # the timer stays: it lapses or re-arms when it fires

    def _head_check(self) -> None:
        self._head_timer = None
        since = self._head_since
        if since is None:
            return  # no head being read
        timeout_s = self._head_timeout_s()
        left = since + timeout_s - self.loop.time()
        if left > 0:  # a later head: its own deadline
            self._head_timer = self.loop.call_later(left, self._head_check)
        elif not self.transport.is_closing():
            self._refuse(ApiError.of("request_timeout", seconds=f"{timeout_s:g}"))

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if transport.get_extra_info("ssl_object") is not None:  # one TLS record per loop turn
            self.transport = CoalescingTransport(transport, self.loop)
        self._head_begins()  # the first request's head: from the connection on

    def handle_websocket_upgrade(self) -> None:
        if isinstance(self.transport, CoalescingTransport):  # the websocket gets the socket's
            self.transport.flush()
            self.transport = self.transport.wrapped
        super().handle_websocket_upgrade()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_since = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook.lost()

    def shutdown(self) -> None:
        for hook in self._hooks:
            hook.shutting_down = True
        super().shutdown()

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        if self._head_since is None:  # else the first request's, timed from the connection
            self._head_begins()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_ends()
        hook = ConnectionHook()
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]  # uvicorn: a TypedDict
        scope[HOOK_KEY] = hook  # the cycle made below holds this same scope
        self._hooks.append(hook)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._hooks:  # the request whose head was parsed last: its body is whole
            self._hooks[-1].body_complete = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._hooks:
            self._hooks.pop(0)  # responses complete in request order
        self._head_ends()  # idle between requests: uvicorn's keep-alive timeout rules

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_head_bytes:
            self._head_too_large = True
            raise HeadTooLargeError

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # _count inline: ~7 headers per request, one call each fewer (issue #27)
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self.max_head_bytes:
            self._head_too_large = True
            raise HeadTooLargeError
        super().on_header(name, value)

    def data_received(self, data: bytes) -> None:
        if self._head_too_large:
            return  # the refusal is out and the connection closing
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            if self._head_too_large:
                self._refuse(ApiError.of("headers_too_large", cap=self.max_head_bytes))
            else:
                self.logger.warning("Invalid HTTP request received.")
                self._refuse(ApiError.of("bad_http_request", reason=str(exc) or "unparseable"))

    def send_400_response(self, msg: str) -> None:
        self._refuse(ApiError.of("bad_http_request", reason=msg.rstrip(".")))

    def _refuse(self, error: ApiError) -> None:
        """Write the error document and close, outside the ASGI app (like uvicorn's 400)."""
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.transport.close()  # mid-response (pipelined garbage): just end
            return
        body = error.body()
        content = [_status_line(error.status)]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()
