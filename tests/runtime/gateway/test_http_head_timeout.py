"""The request head's time bound in our uvicorn protocol (a slow-loris client gets a 408 and
the connection closes), with uvicorn serving on this event loop: the first request's head,
a later one on a kept-alive connection, and a connection idle between requests (not refused:
uvicorn's keep-alive timeout rules there). And the hook's ``body_complete``: whether the
request's whole body was parsed before the app ran (then the consumer arms no body timer)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from fixtures.net import free_port
from fixtures.wait import async_eventually

from runtime.gateway.consumers import HOOK_KEY
from runtime.gateway.http_protocol import BoundedHttpToolsProtocol

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

HEAD_TIMEOUT_S = 0.3
REQUEST = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


class ShortHead(BoundedHttpToolsProtocol):
    def _head_timeout_s(self) -> float:
        return HEAD_TIMEOUT_S


async def ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def server(app: Any = ok) -> AsyncIterator[int]:
    port = free_port()
    served = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, loop="none", http=ShortHead, lifespan="off",
            log_config=None, access_log=False, timeout_keep_alive=30,
        )
    )  # fmt: skip
    task = asyncio.create_task(served.serve())
    try:
        await async_eventually(lambda: served.started or task.done(), timeout=20)
        yield port
    finally:
        served.should_exit = True
        async with asyncio.timeout(20):
            await task


async def stalled_head_refused(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, partial: bytes
) -> None:
    """Send ``partial`` (a head that never ends): a 408 ``request_timeout`` after the bound,
    then the server closes the connection."""
    writer.write(partial)
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(10):
        answer = await reader.read()  # to EOF: the connection is closed after the refusal
    waited = asyncio.get_running_loop().time() - started
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert waited >= HEAD_TIMEOUT_S * 0.9


async def test_a_head_that_never_ends_is_refused_408() -> None:
    async with server() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await stalled_head_refused(reader, writer, b"GET /x HTTP/1.1\r\nHost: t\r\n")


async def test_a_later_slow_head_on_a_kept_alive_connection_is_timed_from_its_start() -> None:
    async with server() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):  # answered requests, each well within the bound
            writer.write(REQUEST)
            async with asyncio.timeout(10):
                assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(HEAD_TIMEOUT_S * 2)  # the scenario: idle between requests
        writer.write(REQUEST)  # not refused: the gap was no head
        async with asyncio.timeout(10):
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        await stalled_head_refused(reader, writer, b"GET /x HTTP/1.1\r\n")


async def test_the_hook_says_whether_the_whole_body_was_parsed_before_the_app_ran() -> None:
    """A body sent with its head: ``body_complete`` when the app starts (no body timer is
    needed); a body sent only once the app runs: not yet, then complete once it came."""
    seen: list[bool] = []
    entered = asyncio.Event()

    async def body_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        hook = scope[HOOK_KEY]
        seen.append(hook.body_complete)
        entered.set()
        message = await receive()
        while message.get("more_body"):
            message = await receive()
        seen.append(hook.body_complete)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})

    head = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n"
    async with server(body_app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(10):
            writer.write(head + b"{}")
            await reader.readuntil(b"ok")
            entered.clear()
            writer.write(head)
            await entered.wait()  # the app runs; its body is not sent yet
            writer.write(b"{}")
            await reader.readuntil(b"ok")
        writer.close()
    assert seen == [True, True, False, True]
