"""CPU per request of the router's uvicorn protocol (:mod:`runtime.gateway.http_protocol`):
the head parsed, the request's task run, a two-byte answer written (issue #27).

``python -m bench.head_timer_micro [--iterations 20000] [--rounds 5] [--before FILE]`` feeds
kept-alive ``GET`` requests to :class:`BoundedHttpToolsProtocol` over a transport that keeps
nothing (no sockets), one at a time on one event loop, and times them with
``time.process_time``. ``--before`` loads an older ``http_protocol.py`` (e.g. from a ``git
worktree`` of an earlier commit) and times both classes in this process, interleaved, so a
busy machine affects both alike; the best of ``rounds`` rounds is reported, in microseconds
per request.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import time
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from runtime.gateway import http_protocol

REQUEST = b"GET /x HTTP/1.1\r\nHost: t\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"


class NullTransport(asyncio.Transport):
    """Takes every write, keeps nothing; a peer at 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: Any) -> None:
        return None

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("http_protocol_before", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BoundedHttpToolsProtocol


async def _time(protocol_class: Any, iterations: int) -> float:
    done = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})
        done.set()

    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    protocol = protocol_class(config, ServerState(), {}, asyncio.get_running_loop())
    protocol.connection_made(NullTransport())

    async def one() -> None:
        done.clear()
        protocol.data_received(REQUEST)
        await done.wait()

    for _ in range(200):  # warm
        await one()
    gc.collect()
    start = time.process_time()
    for _ in range(iterations):
        await one()
    elapsed = time.process_time() - start
    protocol.connection_lost(None)
    return elapsed / iterations * 1e6


async def measure(iterations: int, rounds: int, before: str | None) -> dict[str, float]:
    classes = {"this checkout": http_protocol.BoundedHttpToolsProtocol}
    if before is not None:
        classes["before"] = _load(before)
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, cls in classes.items():  # interleaved: the noise hits each alike
            us = await _time(cls, iterations)
            best[name] = min(us, best.get(name, us))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", help="an older runtime/gateway/http_protocol.py")
    args = parser.parse_args(argv)
    best = asyncio.run(measure(args.iterations, args.rounds, args.before))
    for name, us in best.items():
        print(f"{name:14s} {us:7.2f} us/request")
    if "before" in best:
        print(f"this checkout / before: {best['this checkout'] / best['before']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
