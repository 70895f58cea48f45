"""``python -m bench.transport_proxy --port N --backend URL [--backend URL ...]``.

The router's transport with none of the router's logic (issue #27's floor): a pure ASGI app
under uvicorn with the router's server settings (uvloop, httptools, one worker, no access log,
no proxy-headers middleware) that forwards each POST to the backends round robin with the
router's own upstream client (:class:`runtime.upstream.lean.LeanUpstreamClient`, the router's
default ``SWITCHYARD_UPSTREAM_CLIENT=lean``) and streams the answer back chunk by chunk: each
chunk the engine wrote as it came (the client's ``batches()``, as the router's relay reads
it), a chunk the client had to re-frame as its events, then ``data: [DONE]``.

No auth, no plan, no limits, no queue, no stages, no exit stack, no telemetry: the router's
CPU per request less this one's is what the router adds on top of what it is built on. Its
uvicorn protocol is stock httptools, not the router's ``BoundedHttpToolsProtocol`` (the head's
bound and the connection hook count as the router's chassis).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import uvicorn

from bench.proxy_server import proxy_args
from runtime.snapshot import EndpointSnap
from runtime.upstream.client import ClientConfig
from runtime.upstream.errors import UpstreamError, UpstreamHTTPError
from runtime.upstream.lean import LeanUpstreamClient
from runtime.upstream.response import UpstreamResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TIMEOUT_S = 120.0  # each request's deadline (the router's classes give 30 s to 120 s)
SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
JSON = [(b"content-type", b"application/json")]
DONE_FRAME = b"data: [DONE]\n\n"
_HEALTH = b'{"status":"ok"}'


def endpoints(urls: Sequence[str]) -> list[EndpointSnap]:
    """The backends as the upstream client takes them (what a snapshot would say)."""
    return [
        EndpointSnap(id=i + 1, pool="transport", version=1, base_url=url.rstrip("/"),
                     state="ready", capacity=256)
        for i, url in enumerate(urls)
    ]  # fmt: skip


def framed(raw: bytes | None, payloads: list[bytes]) -> bytes:
    """A batch's bytes: the engine's chunk when it is exactly its events' framing, else the
    events framed again (``data: <payload>\\n\\n`` each)."""
    if raw is not None:
        return raw
    return b"".join(b"data: " + payload + b"\n\n" for payload in payloads)


class TransportProxy:
    """The ASGI app; its upstream client lives from the lifespan's startup to its shutdown."""

    def __init__(self, backends: Sequence[str], *, timeout_s: float = TIMEOUT_S) -> None:
        self._next = itertools.cycle(endpoints(backends)).__next__
        self._timeout_s = timeout_s
        self._client: LeanUpstreamClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._client = LeanUpstreamClient(ClientConfig())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            status, body = (200, _HEALTH) if scope["path"] == "/healthz" else (405, b"{}")
            await _whole(send, status, JSON, body)
            return
        body = await _body(receive)
        client = self._client
        assert client is not None  # the lifespan started it
        query = scope.get("query_string") or b""
        path = scope["path"] + ("?" + query.decode("latin-1") if query else "")
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        try:
            upstream = await client.open_stream(self._next(), path, body, deadline=deadline)
        except UpstreamHTTPError as exc:
            content_type = (exc.content_type or "application/json").encode("latin-1")
            await _whole(send, exc.status, [(b"content-type", content_type)], exc.body)
            return
        except UpstreamError as exc:
            error = {"error": {"message": f"upstream: {exc}"}}
            await _whole(send, 502, JSON, json.dumps(error).encode())
            return
        with contextlib.closing(upstream):
            if upstream.is_stream:
                await _stream(send, upstream)
            else:
                await _whole(send, upstream.status, JSON, await upstream.read_json())


async def _body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body  # the common case: the body came with its head
    parts = [body]
    while message.get("more_body", False):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


async def _whole(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def _stream(send: Send, upstream: UpstreamResponse) -> None:
    await send({"type": "http.response.start", "status": upstream.status, "headers": SSE})
    async with contextlib.aclosing(upstream.batches()) as batches:
        async for raw, payloads in batches:
            await send({"type": "http.response.body", "body": framed(raw, payloads),
                        "more_body": True})  # fmt: skip
    await send({"type": "http.response.body", "body": DONE_FRAME})


def main(argv: Sequence[str] | None = None) -> None:
    args = proxy_args("python -m bench.transport_proxy", __doc__, argv)
    uvicorn.run(
        TransportProxy(args.backend),
        host=args.host,
        port=args.port,
        workers=1,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
