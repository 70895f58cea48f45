"""The router's KV event subscribers: one asyncio task per endpoint that publishes events.

:meth:`KvEventSubscribers.sync` takes the endpoints that announce a KV events address (endpoint
id -> ``tcp://host:port``; :func:`snapshot_addresses` reads them from the snapshot) and keeps
exactly one task per endpoint: a new address starts one, a gone or changed one is cancelled
(its tracker state forgotten). Each task
holds a ZeroMQ SUB socket subscribed to every topic, connected to the engine's PUB socket (ZeroMQ
reconnects by itself), and feeds each decoded message to the
:class:`~runtime.routing.kv_tracker.KvEventTracker`. Nothing is done per request.

Freshness, so scoring falls back to approximate when events stop:

- a socket monitor reports connects and disconnects (ZeroMQ heartbeats, ``heartbeat_s``, make
  a dead peer a disconnect): a drop marks the endpoint not precise until its next event;
- a gap in the messages' sequence numbers (the publisher dropped some, or the engine restarted)
  forgets what the tracker mapped for the endpoint: a missed ``BlockRemoved`` would otherwise
  leave blocks believed held;
- a message that does not decode is counted and logged (once per endpoint), never fatal.

Memory: the socket's receive queue is bounded by ``rcvhwm`` messages (ZeroMQ drops beyond it,
which the sequence gap then reports); the tracker bounds the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Final

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from runtime.redis_conn import cancel_and_wait
from runtime.routing.kv_events import KvEventDecodeError, decode_frames
from runtime.routing.kv_tracker import KvEventTracker
from runtime.snapshot import Snapshot

log = logging.getLogger("switchyard.router.kv_events")

DEFAULT_HEARTBEAT_S: Final = 2.0
DEFAULT_RCVHWM: Final = 10_000
_MONITOR_EVENTS: Final = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED


def snapshot_addresses(snapshot: Snapshot) -> dict[int, str]:
    """The endpoints to subscribe to: every live one that announces a KV events address."""
    return {
        endpoint.id: endpoint.kv_events
        for endpoint in snapshot.endpoints.values()
        if endpoint.kv_events and endpoint.state in ("starting", "ready", "draining")
    }


class KvEventSubscribers:
    """One subscriber task per endpoint; :meth:`sync` with the snapshot, :meth:`close` at exit."""

    def __init__(
        self,
        tracker: KvEventTracker,
        *,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        rcvhwm: int = DEFAULT_RCVHWM,
    ) -> None:
        self.tracker = tracker
        self._clock = clock
        self._heartbeat_ms = max(1, round(heartbeat_s * 1000))
        self._rcvhwm = rcvhwm
        self._context: zmq.asyncio.Context | None = None
        self._tasks: dict[int, tuple[str, asyncio.Task[None]]] = {}
        self.messages: dict[int, int] = {}  # per endpoint: messages applied
        self.bad_messages: dict[int, int] = {}  # per endpoint: messages that did not decode
        self.gaps: dict[int, int] = {}  # per endpoint: sequence gaps seen

    def addresses(self) -> Mapping[int, str]:
        return {endpoint_id: url for endpoint_id, (url, _) in self._tasks.items()}

    def sync(self, endpoints: Mapping[int, str]) -> None:
        """Subscribe to exactly these endpoints (id -> ZeroMQ address; empty: none)."""
        wanted = {endpoint_id: url for endpoint_id, url in endpoints.items() if url}
        self.tracker.watch(wanted)  # dispatches elsewhere leave nothing pending
        for endpoint_id, (url, task) in list(self._tasks.items()):
            if wanted.get(endpoint_id) != url:
                task.cancel()
                del self._tasks[endpoint_id]
                self.tracker.forget(endpoint_id)
        if wanted and self._context is None:
            self._context = zmq.asyncio.Context()
        for endpoint_id, url in wanted.items():
            if endpoint_id not in self._tasks:
                task = asyncio.create_task(
                    self._run(endpoint_id, url), name=f"kv-events-{endpoint_id}"
                )
                self._tasks[endpoint_id] = (url, task)

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        await asyncio.gather(*(cancel_and_wait(task) for task in tasks))
        if self._context is not None:
            self._context.term()
            self._context = None

    def _socket(self, url: str) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        context = self._context
        assert context is not None, "sync() creates the context before starting a task"
        sock = context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
        sock.setsockopt(zmq.HEARTBEAT_IVL, self._heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * self._heartbeat_ms)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5_000)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sock.get_monitor_socket(_MONITOR_EVENTS)
        sock.connect(url)
        return sock, monitor

    async def _run(self, endpoint_id: int, url: str) -> None:
        sock, monitor = self._socket(url)
        poller = zmq.asyncio.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        last_seq: int | None = None
        try:
            while True:
                for ready, _ in await poller.poll():
                    if ready is monitor:
                        self._on_monitor(endpoint_id, url, await monitor.recv_multipart())
                        last_seq = None  # a new connection: the publisher may have restarted
                    else:
                        last_seq = self._on_message(
                            endpoint_id, await sock.recv_multipart(), last_seq
                        )
        finally:
            self.tracker.set_connected(endpoint_id, False)
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)

    def _on_monitor(self, endpoint_id: int, url: str, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        connected = event == zmq.EVENT_CONNECTED
        self.tracker.set_connected(endpoint_id, connected)
        state = "connected" if connected else "disconnected; approximate until events resume"
        log.info("KV events of endpoint %s (%s): %s", endpoint_id, url, state)

    def _on_message(
        self, endpoint_id: int, frames: list[bytes], last_seq: int | None
    ) -> int | None:
        try:
            batch = decode_frames(frames)
        except KvEventDecodeError as exc:
            count = self.bad_messages[endpoint_id] = self.bad_messages.get(endpoint_id, 0) + 1
            if count == 1:
                log.warning("endpoint %s sent a KV event message that does not decode: %s",
                            endpoint_id, exc)  # fmt: skip
            return last_seq
        if last_seq is not None and batch.seq >= 0 and batch.seq != last_seq + 1:
            self.gaps[endpoint_id] = self.gaps.get(endpoint_id, 0) + 1
            log.info("endpoint %s: KV events %s..%s missed; its precise view restarts",
                     endpoint_id, last_seq + 1, batch.seq - 1)  # fmt: skip
            self.tracker.forget(endpoint_id)
        self.tracker.apply(endpoint_id, batch, self._clock())
        self.messages[endpoint_id] = self.messages.get(endpoint_id, 0) + 1
        return batch.seq if batch.seq >= 0 else None
