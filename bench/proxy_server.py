"""``python -m bench.proxy_server --port N --backend URL [--backend URL ...]``.

The bare reverse proxy of the benchmark: round robin over the backends, the request body
forwarded as is, the answer streamed back chunk by chunk with its status and content type.
No parsing, no auth, no policy: the least any proxy in front of model servers does, so a
router's requests/s per core can be read against it.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web


class RoundRobin:
    """The next backend in turn."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._urls = itertools.cycle([u.rstrip("/") for u in urls])

    def next(self) -> str:
        return next(self._urls)


BACKENDS = web.AppKey("backends", RoundRobin)
SESSION = web.AppKey("session", aiohttp.ClientSession)
_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    app[SESSION] = aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False
    )
    yield
    await app[SESSION].close()


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _forward(request: web.Request) -> web.StreamResponse:
    base = request.app[BACKENDS].next()
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
    session = request.app[SESSION]
    try:
        upstream = await session.request(
            request.method, f"{base}{request.rel_url}", data=body, headers=headers
        )
    except aiohttp.ClientError as exc:
        return web.json_response({"error": {"message": f"upstream: {exc}"}}, status=502)
    try:
        response = web.StreamResponse(status=upstream.status)
        content_type = upstream.headers.get("Content-Type")
        if content_type:
            response.headers["Content-Type"] = content_type
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        upstream.release()


def create_app(backends: Sequence[str]) -> web.Application:
    app = web.Application(client_max_size=64 * 2**20)
    app[BACKENDS] = RoundRobin(backends)
    app.cleanup_ctx.append(_session_ctx)
    app.router.add_get("/healthz", _health)
    app.router.add_route("*", "/{tail:.*}", _forward)
    return app


def proxy_args(
    prog: str, description: str | None, argv: Sequence[str] | None
) -> argparse.Namespace:
    """A bench proxy's command line: ``--host``, ``--port``, ``--backend URL`` (repeated)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True, help="backend base URL")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = proxy_args("python -m bench.proxy_server", __doc__, argv)
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up, as the routers have

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None
    web.run_app(
        create_app(args.backend),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        handler_cancellation=True,
        loop=loop_factory() if loop_factory else None,
    )


if __name__ == "__main__":
    main()
