"""CPU per streamed response of the router's uvicorn protocol over real sockets (issue #27):
the socket writes a response costs, head and chunks.

``python -m bench.head_write_micro [--requests 4000] [--rounds 4] [--before FILE]`` starts a
server process (pinned with ``taskset`` to the last core) running uvicorn with
:class:`~runtime.gateway.http_protocol.BoundedHttpToolsProtocol` and an app that answers each
request as the router answers a stream: a head of 10 headers, the first event in the same
event-loop turn, then 7 events one turn apart, the last ending the response. The client (this
process, on the other cores) sends ``requests`` kept-alive requests over 4 connections and
reads each answer to its end; the server's CPU (``/proc``: user + system, so the kernel's
send path counts) per request is reported. ``--before`` loads an older ``http_protocol.py``
(e.g. from a ``git worktree`` of ``main``) for a second server, and the rounds alternate
A B B A..., so a busy machine affects both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import uvicorn

from runtime.gateway.http_protocol import BoundedHttpToolsProtocol

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-request-id", b"0123456789abcdef0123456789abcdef"),
    (b"x-ratelimit-limit-requests", b"100000"),
    (b"x-ratelimit-limit-tokens", b"10000000"),
    (b"x-ratelimit-remaining-requests", b"99999"),
    (b"x-ratelimit-remaining-tokens", b"9999000"),
    (b"x-ratelimit-reset-requests", b"1ms"),
    (b"x-ratelimit-reset-tokens", b"6ms"),
    (b"x-switchyard-model-version", b"sim-model@1"),
]
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
END = b"0\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": EVENT, "more_body": True})
    for n in range(7):
        await asyncio.sleep(0)  # the next upstream read: another turn
        await send({"type": "http.response.body", "body": EVENT, "more_body": n < 6})


def _protocol(before: str | None) -> type:
    if before is None:
        return BoundedHttpToolsProtocol
    spec = importlib.util.spec_from_file_location("http_protocol_before", before)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls: type = module.BoundedHttpToolsProtocol
    return cls


def serve(port: int, before: str | None) -> None:
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=_protocol(before), lifespan="off",
        log_config=None, access_log=False, loop="uvloop",
    )  # fmt: skip
    uvicorn.Server(config).run()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _client(port: int, count: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(count):
        writer.write(REQUEST)
        await reader.readuntil(END)
    writer.close()


async def _up(port: int) -> None:
    """Wait for the server, then warm it."""
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        except OSError:
            await asyncio.sleep(0.05)
    await _client(port, 50)


async def _load(port: int, requests: int, connections: int = 4) -> None:
    await asyncio.gather(*(_client(port, requests // connections) for _ in range(connections)))


def one_round(before: str | None, requests: int) -> float:
    """The server's CPU per request (µs) for ``requests`` streamed responses."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    core = str((os.cpu_count() or 1) - 1)
    argv = [sys.executable, "-m", "bench.head_write_micro", "--serve", str(port)]
    if before is not None:
        argv += ["--before", before]
    server = subprocess.Popen(["taskset", "-c", core, *argv])  # noqa: S603, S607 - argv built here
    try:
        asyncio.run(_up(port))
        start = _cpu_s(server.pid)
        asyncio.run(_load(port, requests))
        return (_cpu_s(server.pid) - start) / requests * 1e6
    finally:
        server.terminate()
        server.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--before", default=None, help="an older http_protocol.py")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.before)
        return
    targets: list[str | None] = [None] if args.before is None else [None, args.before]
    figures: dict[str | None, list[float]] = {t: [] for t in targets}
    for n in range(args.rounds):
        order = targets if n % 2 == 0 else targets[::-1]
        for target in order:
            figures[target].append(one_round(target, args.requests))
    for target, values in figures.items():
        name = "this tree" if target is None else f"before ({target})"
        rounds = " / ".join(f"{v:.1f}" for v in values)
        print(f"{name}: server CPU per response {statistics.median(values):.1f} µs "
              f"(median; rounds {rounds})")  # fmt: skip
    print(f"at {time.strftime('%H:%M:%S')}, load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
