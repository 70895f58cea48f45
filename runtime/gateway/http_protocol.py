"""uvicorn's httptools protocol with a bound on the request head and OpenAI-shaped refusals.

uvicorn buffers a request's URL and headers without limit under httptools. Here the request
line plus headers may hold :data:`MAX_HEAD_BYTES`; past that the client gets a 431
``headers_too_large`` and the connection closes, before any of it reaches the app. A request
the parser cannot read (a malformed request line, bad chunked framing) gets uvicorn's 400,
but as an OpenAI error document (``bad_http_request``) instead of plain text.

Used by ``python -m runtime.gateway`` (``http=BoundedHttpToolsProtocol``).
"""

from __future__ import annotations

from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from runtime.gateway.errors import ApiError

MAX_HEAD_BYTES = 64 * 1024  # request line + headers; nginx allows 32 KiB, Go 1 MiB


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

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        super().on_message_begin()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_head_bytes:
            self._head_too_large = True
            raise HeadTooLargeError

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
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
        if self.cycle is not None and self.cycle.response_started:
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
