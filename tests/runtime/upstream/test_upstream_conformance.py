"""The same cases against both upstream clients (``SWITCHYARD_UPSTREAM_CLIENT``: ``aiohttp``
and ``lean``): status classification, chunked and content-length bodies, keep-alive reuse,
a cancelled or abandoned stream never reused, TLS with a client certificate (mTLS) and a
bounded shutdown with a TLS peer that never answers close_notify.

The worker is an in-process aiohttp app; it records the client port of every request, which
tells a reused connection from a new one.
"""

from __future__ import annotations

import asyncio
import math
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from aiohttp import web
from fixtures.wait import async_eventually

from config.tls import LocalPKI, ensure_local_pki
from runtime import tls
from runtime.upstream import (
    ConnectFailed,
    ConnectionDropped,
    DeadlineExceeded,
    FirstByteTimeout,
    StreamBroken,
    UpstreamClient,
    UpstreamHTTPError,
)
from runtime.upstream.choice import CLIENTS, new_client
from runtime.upstream.client import ClientConfig
from runtime.upstream.timeouts import TimeoutPolicy
from tests.runtime.upstream.conftest import drain, endpoint

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

KINDS = sorted(CLIENTS)
CHAT = "/v1/chat/completions"
EVENTS = [b'{"n":1}', b'{"n":2}']


class Worker:
    """Routes: ``/sse`` (chunked events, ``[DONE]``), ``/sse-whole`` (the same with a
    Content-Length), ``/unary`` (JSON), ``/status/{code}``, ``/stall`` (one event, then
    silence), ``/drop`` (hangs up before answering), ``/silent`` (no answer)."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.disconnects = 0
        self.runner: web.AppRunner | None = None

    def _seen(self, request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.ports.append(peer[1] if peer else -1)

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in EVENTS:
            await resp.write(b"data: " + event + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _sse_whole(self, request: web.Request) -> web.Response:
        self._seen(request)
        text = "".join(f"data: {e.decode()}\n\n" for e in EVENTS) + "data: [DONE]\n\n"
        return web.Response(text=text, content_type="text/event-stream")

    async def _unary(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.json_response({"echo": len(await request.read())})

    async def _status(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.json_response({"error": "x" * 100}, status=int(request.match_info["code"]))

    async def _stall(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + EVENTS[0] + b"\n\n")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.disconnects += 1
            raise
        return resp

    async def _silent(self, request: web.Request) -> web.Response:
        await asyncio.sleep(60)
        return web.Response()

    async def _drop(self, request: web.Request) -> web.Response:
        assert request.transport is not None
        request.transport.abort()
        raise web.HTTPInternalServerError

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> str:
        app = web.Application()
        for path, handler in (("/sse", self._sse), ("/sse-whole", self._sse_whole),
                              ("/unary", self._unary), ("/status/{code}", self._status),
                              ("/stall", self._stall), ("/drop", self._drop),
                              ("/silent", self._silent)):  # fmt: skip
            app.router.add_post(path, handler)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        scheme = "https" if ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest_asyncio.fixture
async def worker() -> AsyncIterator[Worker]:
    w = Worker()
    yield w
    await w.stop()


@pytest_asyncio.fixture(params=KINDS)
async def client(request: pytest.FixtureRequest) -> AsyncIterator[UpstreamClient]:
    c = new_client(request.param, ClientConfig(timeouts=TimeoutPolicy(first_byte_cap=5.0)))
    yield c
    await c.close()


def _deadline(seconds: float = 10.0) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_chunked_and_content_length_bodies(client: UpstreamClient, worker: Worker) -> None:
    ep = endpoint(1, await worker.start())
    async with asyncio.timeout(10):
        for path in ("/sse", "/sse-whole"):
            resp = await client.open_stream(ep, path, b"{}", deadline=_deadline())
            seen: list[bytes] = []
            await drain(resp, seen)
            assert (seen, resp.done, resp.status) == (EVENTS, True, 200)
            assert resp.headers["content-type"].startswith("text/event-stream")
        unary = await client.open_stream(
            ep, "/unary", b"{" + b" " * 70_000 + b"}", deadline=_deadline(), first_byte_cap=math.inf
        )
        assert await unary.read_json() == b'{"echo": 70002}'
        await unary.aclose()


@pytest.mark.parametrize(
    ("status", "retryable", "fault"), [(500, True, True), (429, True, False), (400, False, False)]
)
async def test_status_classification(
    client: UpstreamClient, worker: Worker, status: int, retryable: bool, fault: bool
) -> None:
    ep = endpoint(1, await worker.start())
    async with asyncio.timeout(10):
        with pytest.raises(UpstreamHTTPError) as caught:
            await client.open_stream(ep, f"/status/{status}", b"{}", deadline=_deadline())
        # An error body read whole leaves the connection reusable.
        resp = await client.open_stream(ep, "/sse", b"{}", deadline=_deadline())
        await drain(resp, [])
    error = caught.value
    assert (error.status, error.retryable, error.endpoint_fault) == (status, retryable, fault)
    assert error.body.startswith(b'{"error": "xxx')
    assert error.content_type == "application/json"
    assert worker.ports[0] == worker.ports[1]


async def test_connection_failures_are_classified_alike(
    client: UpstreamClient, worker: Worker, closed_port: int
) -> None:
    ep = endpoint(1, await worker.start())
    async with asyncio.timeout(10):
        with pytest.raises(ConnectFailed, match="cannot connect"):
            await client.open_stream(
                endpoint(2, f"http://127.0.0.1:{closed_port}"), CHAT, b"{}", deadline=_deadline()
            )
        with pytest.raises(ConnectionDropped, match="before the first byte"):
            await client.open_stream(ep, "/drop", b"{}", deadline=_deadline())
        with pytest.raises(FirstByteTimeout):
            await client.open_stream(ep, "/silent", b"{}", deadline=_deadline(), first_byte_cap=0.2)
        with pytest.raises(DeadlineExceeded):
            await client.open_stream(ep, "/silent", b"{}", deadline=_deadline(0.2))


async def test_keep_alive_reuses_one_connection(client: UpstreamClient, worker: Worker) -> None:
    ep = endpoint(1, await worker.start())
    async with asyncio.timeout(10):
        for path in ("/sse", "/sse-whole", "/sse"):
            await drain(await client.open_stream(ep, path, b"{}", deadline=_deadline()), [])
    assert len(worker.ports) == 3
    assert len(set(worker.ports)) == 1


@pytest.mark.parametrize("how", ["aclose", "cancel"])
async def test_an_abandoned_stream_is_cut_and_its_connection_never_reused(
    client: UpstreamClient, worker: Worker, how: str
) -> None:
    ep = endpoint(1, await worker.start())
    async with asyncio.timeout(10):
        resp = await client.open_stream(ep, "/stall", b"{}", deadline=_deadline())
        if how == "aclose":
            await resp.aclose()
        else:
            got: list[bytes] = []
            reader = asyncio.create_task(drain(resp, got))
            await async_eventually(lambda: got == [EVENTS[0]], timeout=5, what="first event")
            reader.cancel()  # waiting on the stalled stream
            with pytest.raises(asyncio.CancelledError):
                await reader
        assert resp.closed
        await async_eventually(lambda: worker.disconnects == 1, timeout=5, what="disconnect")
        await drain(await client.open_stream(ep, "/sse", b"{}", deadline=_deadline()), [])
    assert worker.ports[0] != worker.ports[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPKI:
    return ensure_local_pki(tmp_path_factory.mktemp("conformance-pki"))[0]


def _server_tls(pki: LocalPKI) -> ssl.SSLContext:
    """A worker's TLS requiring client certificates signed by the CA (vLLM's
    ``--ssl-cert-reqs 2``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    context.load_cert_chain(pki.cert, pki.key)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


@pytest.mark.parametrize("kind", KINDS)
async def test_tls_and_mtls(kind: str, worker: Worker, pki: LocalPKI) -> None:
    ep = endpoint(1, await worker.start(_server_tls(pki)))
    cases = {
        "cert": tls.ClientTLS(ca=pki.ca, cert=pki.cert, key=pki.key),
        "no cert": tls.ClientTLS(ca=pki.ca),
        "no ca": tls.ClientTLS(),
    }
    seen: dict[str, str] = {}
    for name, client_tls in cases.items():
        client = new_client(kind, ClientConfig(tls=client_tls.context()))
        try:
            async with asyncio.timeout(10):
                resp = await client.open_stream(ep, "/sse", b"{}", deadline=_deadline())
                events: list[bytes] = []
                await drain(resp, events)
                seen[name] = repr(events)
        except (ConnectFailed, ConnectionDropped) as exc:
            seen[name] = str(exc)
        finally:
            await client.close()
    assert seen["cert"] == repr(EVENTS)
    assert seen["no cert"].startswith("TLS")
    assert "SWITCHYARD_UPSTREAM_TLS_CERT" in seen["no cert"]
    assert seen["no ca"].startswith("TLS: the worker 127.0.0.1:")
    assert "certificate we do not trust" in seen["no ca"]


class SilentTLSPeer:
    """A TLS worker (blocking sockets, a thread) that answers one request with a 200 and an
    endless event stream's first event, then never reads or writes again: it never answers
    a close_notify."""

    def __init__(self, pki: LocalPKI) -> None:
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(pki.cert, pki.key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        raw, _ = self._listener.accept()
        with self._context.wrap_socket(raw, server_side=True) as conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                b'0f\r\ndata: {"n":1}\n\n\r\n'
            )
            self._done.wait(30)
            raw.close()

    def stop(self) -> None:
        self._done.set()
        self._listener.close()
        self._thread.join(5)


@pytest.fixture
def silent_peer(pki: LocalPKI) -> Iterator[SilentTLSPeer]:
    peer = SilentTLSPeer(pki)
    yield peer
    peer.stop()


@pytest.mark.parametrize("kind", KINDS)
async def test_close_is_bounded_with_a_tls_peer_that_never_sends_close_notify(
    kind: str, silent_peer: SilentTLSPeer, pki: LocalPKI
) -> None:
    """Shutdown (the router's lifespan closes the client after the drain) never waits for
    the peer's close_notify. The lean client also cuts a stream still in flight: its reader
    hears StreamBroken at once. aiohttp's ``session.close()`` leaves that reader waiting
    for its deadline (measured: 60 s of a 60 s deadline), which the aiohttp path keeps."""
    client = new_client(kind, ClientConfig(tls=tls.ClientTLS(ca=pki.ca).context()))
    ep = endpoint(1, f"https://127.0.0.1:{silent_peer.port}")
    events: list[bytes] = []
    try:
        async with asyncio.timeout(10):
            resp = await client.open_stream(ep, CHAT, b"{}", deadline=_deadline(30))
            reader = asyncio.create_task(drain(resp, events))
            await async_eventually(lambda: events == [EVENTS[0]], timeout=5, what="first event")
    finally:
        async with asyncio.timeout(3):
            await client.close()
    if kind == "aiohttp":
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        return
    async with asyncio.timeout(3):
        with pytest.raises(StreamBroken, match="closed by the router"):
            await reader
    assert resp.closed
