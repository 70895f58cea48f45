"""CPU per request of the router's HTTP entry, per flavour (issue #27, must-have 3).

``python -m bench.http_entry_micro [--iterations 20000] [--rounds 5]`` drives each entry
(:func:`runtime.gateway.app.http_entry`: ``asgi``, the pure routes, and ``channels``, the
Channels consumers) with the ASGI messages uvicorn would send for one request: a body-less
``GET /healthz`` and a ``POST`` to ``/v1/nowhere`` (the 404 consumer), then
``http.disconnect`` once the response is complete; timed with ``time.process_time`` on one
event loop, no sockets. ``bare`` is a handler that answers the same bytes straight from the
ASGI call (no consumer, no handler task, no receive loop): what is left above it is the
consumer layer's cost (routing, the consumer object, its handler task, the receive loop).
``inline`` is ``asgi`` with the connection hook our uvicorn protocol puts in every scope
(:mod:`runtime.gateway.http_protocol`): the consumer answers in the request's own task, with
no handler task and no receive loop (what ``python -m runtime.gateway`` serves).
The best of ``rounds`` rounds is reported, in microseconds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from runtime.gateway.app import http_entry
from runtime.gateway.config import RouterConfig
from runtime.gateway.consumers import HOOK_KEY, ConnectionHook
from runtime.gateway.state import STATE_KEY

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
PATHS = (("GET", "/healthz"), ("POST", "/v1/nowhere"))


def _scope(method: str, path: str, state: object) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": [(b"host", b"127.0.0.1")], "state": {STATE_KEY: state},
    }  # fmt: skip


async def _one(app: App, scope: dict[str, Any]) -> None:
    done = asyncio.Event()
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(scope, receive, send)


async def _bare(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b'{"status":"ok"}', "more_body": False})


async def _time(app: App, iterations: int, scope: dict[str, Any]) -> float:
    for _ in range(200):  # warm
        await _one(app, dict(scope))
    gc.collect()
    start = time.process_time()
    for _ in range(iterations):
        await _one(app, dict(scope))
    return (time.process_time() - start) / iterations * 1e6


async def measure(iterations: int, rounds: int) -> dict[tuple[str, str], float]:
    """Best microseconds per request, by (flavour, request)."""
    state = SimpleNamespace(config=RouterConfig())
    asgi = http_entry("asgi")

    async def inline(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[HOOK_KEY] = ConnectionHook()  # as runtime.gateway.http_protocol does
        await asgi(scope, receive, send)

    apps: dict[str, App] = {
        "bare": _bare, "asgi": asgi, "channels": http_entry("channels"), "inline": inline,
    }  # fmt: skip
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for method, path in PATHS:
            for name, app in apps.items():  # interleaved: the noise hits each alike
                us = await _time(app, iterations, _scope(method, path, state))
                key = (name, f"{method} {path}")
                best[key] = min(us, best.get(key, us))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    best = asyncio.run(measure(args.iterations, args.rounds))
    for (name, request), us in best.items():
        bare = best[("bare", request)]
        above = "" if name == "bare" else f"  (+{us - bare:.1f} us above bare)"
        print(f"{request:18s} {name:9s} {us:7.1f} us/request{above}")
    for method, path in PATHS:
        request = f"{method} {path}"
        ratio = best[("channels", request)] / best[("asgi", request)]
        print(f"{request:18s} channels / asgi: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
