"""Admission's Redis-down fallback has hysteresis (issue #30, "a hair trigger"): one Redis call
slower than its timeout does not flip the router to its per-process limits, and a request
refused only by the fallback's share is asked of Redis again (after the settlements queued
meanwhile are written, so Redis does not count slots already freed); a stopped Redis still
enters the fallback. Real redis-server behind a TCP proxy that can hold back one reply."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging

import pytest
from fixtures.private_redis import PrivateRedis

from runtime.admission.limits import LimitExceededError, Quota
from runtime.admission.redis_limits import RedisLimits
from runtime.admission.scripts import SETTLE_LUA

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CAP = 16  # the tenant's global concurrency cap; the fallback's share is CAP / 2 replicas
QUOTA = Quota(rpm=1_000_000, tpm=100_000_000, concurrency=CAP)
TIMEOUT_S = 0.2
SETTLE_SHA = hashlib.sha1(SETTLE_LUA.encode()).hexdigest().encode()  # in every settle call


class StallProxy:
    """Forwards TCP to Redis; :meth:`stall_next` holds back the next reply chunk (one call on
    one connection) for ``delay_s``, every other connection flowing meanwhile (``on``: the reply
    to the next request that contains those bytes); :meth:`hold_all` holds back every reply for
    a while (a Redis that hangs)."""

    def __init__(self, port: int) -> None:
        self._target = port
        self._server: asyncio.Server | None = None
        self._stall_s = 0.0
        self._stall_on = b""
        self._hold_until = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self.stalled = 0

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    def stall_next(self, delay_s: float, *, on: bytes = b"") -> None:
        self._stall_s, self._stall_on = delay_s, on

    def hold_all(self, for_s: float) -> None:
        self._hold_until = asyncio.get_running_loop().time() + for_s

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        armed: list[float] = []  # this connection's next reply is stalled this long
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, armed, replies=False)),
            asyncio.create_task(self._pump(up_reader, writer, armed, replies=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        armed: list[float],
        *,
        replies: bool,
    ) -> None:
        try:
            while chunk := await reader.read(65536):
                wanted = (not replies and self._stall_on in chunk) if self._stall_on else replies
                if self._stall_s > 0 and wanted:
                    armed.append(self._stall_s)
                    self._stall_s = 0.0
                if replies and armed:
                    self.stalled += 1
                    await asyncio.sleep(armed.pop())  # this one reply is late: it times out
                hold = self._hold_until - asyncio.get_running_loop().time()
                if replies and hold > 0:
                    await asyncio.sleep(hold)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                writer.close()


async def at_the_cap(
    limits: RedisLimits, proxy: StallProxy, *, rounds: int, stall_on: bytes
) -> tuple[int, int, int]:
    """CAP clients, each holding one request at a time (the tenant at its cap) for ``rounds``
    requests; one reply stalled past the timeout in the middle (the next reply, or the next
    to a request containing ``stall_on``). (refused, admitted locally, admitted by Redis
    while the fallback was on: asked again after the share refused them)."""
    refused = local = retried = 0
    stalled = asyncio.Event()

    async def client(i: int) -> None:
        nonlocal refused, local, retried
        for n in range(rounds):
            if i == 0 and n == rounds // 3:
                proxy.stall_next(TIMEOUT_S * 4, on=stall_on)
                stalled.set()
            degraded = limits.degraded
            try:
                lease = await limits.acquire("acme", QUOTA, tokens=10)
            except LimitExceededError:
                refused += 1
                continue
            local += lease.source == "local"
            retried += degraded and lease.source == "redis"
            await asyncio.sleep(0.005)  # the request runs
            limits.settle(lease, actual_tokens=10, served=True)
            await limits.slots_freed()

    await asyncio.gather(*(client(i) for i in range(CAP)))
    assert stalled.is_set()
    assert proxy.stalled == 1, "the stall was not injected"
    return refused, local, retried


async def run_at_cap(
    server: PrivateRedis, *, stall_on: bytes = b"", **kwargs: object
) -> tuple[int, int, bool]:
    proxy = StallProxy(server.port)
    await proxy.start()
    limits = RedisLimits(proxy.url, prefix="sytest:ops:hysteresis", replicas=2,
                         timeout_s=TIMEOUT_S, retry_s=5.0, allowance_ttl_s=None,
                         **kwargs)  # type: ignore[arg-type]  # fmt: skip
    await limits.start()
    try:
        refused, _local, retried = await at_the_cap(limits, proxy, rounds=30, stall_on=stall_on)
        return refused, retried, limits.degraded
    finally:
        await limits.stop()
        await proxy.stop()


@pytest.mark.asyncio
async def test_one_slow_call_at_the_cap_refuses_nothing(
    server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="runtime.admission.redis_limits"):
        refused, _retried, degraded = await run_at_cap(server)
    assert refused == 0  # 0 spurious 429s
    assert "a Redis call failed" in caplog.text  # the stalled call timed out
    assert "Redis unreachable" not in caplog.text  # and did not enter the fallback
    assert not degraded


@pytest.mark.asyncio
async def test_a_fallback_share_refusal_is_asked_of_redis_again(
    server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # a hair trigger (one failure enters the fallback, for 5 s): the local share of 8 would
    # refuse half the tenant's requests; each is asked of Redis once more, which answers.
    # The stalled call is a settlement write: every client waits on it (its slot freed), so
    # when it times out no other call is in flight to end the fallback but the retries; the
    # slots freed meanwhile are still queued, and Redis must not count them
    with caplog.at_level(logging.INFO, logger="runtime.admission.redis_limits"):
        refused, retried, degraded = await run_at_cap(server, stall_on=SETTLE_SHA, fail_after=1)
    assert "Redis unreachable" in caplog.text  # the stall entered the fallback
    assert refused == 0
    assert retried >= 1  # requests the share refused were admitted by Redis
    assert not degraded  # Redis answered a retried request: the fallback ended


@pytest.mark.asyncio
async def test_a_stopped_redis_still_enters_the_fallback(server: PrivateRedis) -> None:
    limits = RedisLimits(server.url, prefix="sytest:ops:hysteresis", replicas=2, retry_s=0.2,
                         allowance_ttl_s=None)  # fmt: skip
    await limits.start()
    try:
        lease = await limits.acquire("acme", QUOTA, tokens=10)
        assert lease.source == "redis"
        limits.settle(lease, actual_tokens=10, served=True)
        await limits.flush()
        server.kill()
        lease = await limits.acquire("acme", QUOTA, tokens=10)  # refused connection: at once
        assert lease.source == "local"
        assert limits.degraded
        server.start()
        for _ in range(200):
            lease = await limits.acquire("acme", QUOTA, tokens=10)
            limits.settle(lease, actual_tokens=10, served=True)
            if lease.source == "redis":
                break
            await asyncio.sleep(0.05)
        assert lease.source == "redis"
        assert not limits.degraded
    finally:
        await limits.stop()


@pytest.mark.asyncio
async def test_timeouts_enter_the_fallback_after_the_stated_run(server: PrivateRedis) -> None:
    proxy = StallProxy(server.port)
    await proxy.start()
    limits = RedisLimits(proxy.url, prefix="sytest:ops:hysteresis", replicas=2,
                         timeout_s=TIMEOUT_S, retry_s=5.0, allowance_ttl_s=None,
                         fail_for_s=60.0)  # fmt: skip
    await limits.start()
    try:
        proxy.hold_all(30.0)  # Redis hangs: every call times out, one after another
        first = await limits.acquire("acme", QUOTA, tokens=10)
        assert first.source == "local"
        assert not limits.degraded  # one timeout is not an outage
        acquires = 1
        while not limits.degraded:
            lease = await limits.acquire("acme", QUOTA, tokens=10)
            assert lease.source == "local"
            acquires += 1
            assert acquires <= 3, "three timeouts in a row did not enter the fallback"
    finally:
        proxy.hold_all(0.0)
        await limits.stop()
        await proxy.stop()
