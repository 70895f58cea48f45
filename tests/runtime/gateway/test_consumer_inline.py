"""One task per request (issue #27, must-have 4): with the ConnectionHook our uvicorn protocol
puts in the scope, a consumer answers in the request's own task; a lost connection, the
server's shutdown cut, a body timeout and an oversized body end it as the task mode does.
The protocol's side (the hook in a real server's scope, fired on a lost connection) runs in
the router subprocesses of the gateway tests (``test_gateway_shutdown``, ``_failures``)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.gateway.config import RouterConfig
from runtime.gateway.consumers import HOOK_KEY, ROUTER_SHUTDOWN, ConnectionHook, GatewayConsumer
from runtime.gateway.request_ids import RequestIds
from runtime.gateway.state import STATE_KEY

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


class Probe(GatewayConsumer):
    """Records the task it answers in; answers at once, or waits (then sees the cancel)."""

    methods = ("POST",)

    def __init__(self, *, wait: bool = False) -> None:
        super().__init__()
        self.wait = wait
        self.answered_in: asyncio.Task[Any] | None = None
        self.tasks_while_answering = 0
        self.started = asyncio.Event()
        self.cut_seen: list[str | None] = []

    async def respond(self, body: bytes) -> None:
        self.answered_in = asyncio.current_task()
        self.tasks_while_answering = len(asyncio.all_tasks())
        if self.wait:
            self.started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cut_seen.append(self.current_cut())
                raise
        await self.send_json(200, b'{"ok":true}')


class Exchange:
    """The server side of one request: the messages the app receives, what it sent."""

    def __init__(
        self, body: list[bytes], *, hook: ConnectionHook | None, timeout_s: float = 30,
        ends: bool = True,
    ) -> None:  # fmt: skip
        self.chunks = list(body)
        self.ends = ends  # False: the body's last chunk says more is coming, and none does
        self.sent: list[dict[str, Any]] = []
        self.done = asyncio.Event()
        config = RouterConfig(max_body_bytes=64, body_timeout_s=timeout_s)
        state = SimpleNamespace(config=config, request_ids=RequestIds())
        self.scope: dict[str, Any] = {
            "type": "http", "method": "POST", "path": "/probe", "headers": [],
            "state": {STATE_KEY: state},
        }  # fmt: skip
        if hook is not None:
            self.scope[HOOK_KEY] = hook

    async def receive(self) -> dict[str, Any]:
        if self.chunks:
            chunk = self.chunks.pop(0)
            more = bool(self.chunks) or not self.ends
            return {"type": "http.request", "body": chunk, "more_body": more}
        await self.done.wait()  # the response's end (uvicorn: then http.disconnect)
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.done.set()

    @property
    def status(self) -> int | None:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    def error_code(self) -> str:
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return str(json.loads(body)["error"]["code"])


async def test_with_the_hook_the_handler_runs_in_the_requests_own_task() -> None:
    for hook in (ConnectionHook(), None):
        probe, exchange = Probe(), Exchange([b"{}"], hook=hook)
        before = len(asyncio.all_tasks())
        await probe(exchange.scope, exchange.receive, exchange.send)
        assert exchange.status == 200
        if hook is not None:
            assert probe.answered_in is asyncio.current_task()
            assert probe.tasks_while_answering == before  # no handler task beside it
            assert hook.on_lost is None  # cleared once answered
        else:  # no hook: the task mode (a handler task beside the receive loop)
            assert probe.answered_in is not asyncio.current_task()
            assert probe.tasks_while_answering == before + 1


async def test_a_lost_connection_cancels_the_handler_and_ends_quietly() -> None:
    hook = ConnectionHook()
    probe, exchange = Probe(wait=True), Exchange([b"{}"], hook=hook)
    call = asyncio.create_task(probe(exchange.scope, exchange.receive, exchange.send))
    await asyncio.wait_for(probe.started.wait(), 5)
    hook.lost()
    await asyncio.wait_for(call, 5)  # returns, does not raise
    assert probe.client_gone
    assert probe.cut_seen == [None]  # the client went away: nothing more is sent
    assert exchange.sent == []


async def test_the_servers_cancel_during_shutdown_is_the_router_shutdown_cut() -> None:
    hook = ConnectionHook()
    probe, exchange = Probe(wait=True), Exchange([b"{}"], hook=hook)
    call = asyncio.create_task(probe(exchange.scope, exchange.receive, exchange.send))
    await asyncio.wait_for(probe.started.wait(), 5)
    hook.shutting_down = True
    call.cancel()  # what uvicorn does once the grace period is over
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, 5)
    assert probe.cut_seen == [ROUTER_SHUTDOWN]
    assert exchange.status == 503
    assert exchange.error_code() == ROUTER_SHUTDOWN


async def test_a_body_that_never_ends_is_refused_408_inline() -> None:
    probe = Probe()
    exchange = Exchange([b"{"], hook=ConnectionHook(), timeout_s=0.05, ends=False)
    async with asyncio.timeout(5):  # in this task (wait_for would make another)
        await probe(exchange.scope, exchange.receive, exchange.send)
    assert exchange.status == 408
    assert exchange.error_code() == "request_timeout"
    assert probe.answered_in is None
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0  # its own cancel taken back


async def test_a_body_the_server_already_has_is_read_with_no_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``body_complete`` (the protocol parsed the whole body before the task ran): no body
    timer is armed; without it one is, as before."""
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_later = loop.call_later

    def recording(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        armed.append(delay)
        return call_later(delay, callback, *args)

    monkeypatch.setattr(loop, "call_later", recording)
    for complete in (True, False):
        hook = ConnectionHook()
        hook.body_complete = complete
        probe, exchange = Probe(), Exchange([b"{}"], hook=hook, timeout_s=7)
        armed.clear()
        await asyncio.wait_for(probe(exchange.scope, exchange.receive, exchange.send), 5)
        assert exchange.status == 200
        assert armed.count(7) == (0 if complete else 1)


async def test_an_oversized_body_is_refused_413_inline() -> None:
    probe, exchange = Probe(), Exchange([b"x" * 40, b"y" * 40], hook=ConnectionHook())
    await asyncio.wait_for(probe(exchange.scope, exchange.receive, exchange.send), 5)
    assert exchange.status == 413
    assert exchange.error_code() == "request_too_large"
    assert probe.answered_in is None
