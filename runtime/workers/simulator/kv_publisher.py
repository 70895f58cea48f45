"""The simulator's KV events: what its prefix cache stores and evicts, published as vLLM does.

``--kv-events-endpoint tcp://127.0.0.1:PORT`` binds a ZeroMQ PUB socket there and publishes, for
each change of the prefix cache (:class:`~runtime.workers.simulator.prefix_cache.PrefixCache`),
one message in vLLM's wire format (:func:`runtime.routing.kv_events.encode_frames`: topic,
8-byte sequence number, msgpack ``KVEventBatch``): ``BlockStored`` for a request's new full
blocks at admission (continuing the longest cached run) and for its generated text's full blocks
when it leaves the batch (continuing its prompt's chain), ``BlockRemoved`` for LRU evictions and
``AllBlocksCleared`` on ``/reset_prefix_cache``. Block hashes are the simulator's own (Python
ints); ``token_ids`` are zeros of the right length (the router never reads them). Sending never
blocks: past the high-water mark ZeroMQ drops messages, and the sequence gap tells subscribers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import zmq

from runtime.routing.kv_events import AllCleared, BlockRemoved, BlockStored, KvEvent, encode_frames

DEFAULT_TOPIC = b""
_SNDHWM = 100_000


class KvEventPublisher:
    """A PUB socket bound at ``endpoint``; a :class:`~runtime.workers.simulator.prefix_cache.
    CacheListener`. :meth:`close` unbinds it."""

    def __init__(self, endpoint: str, *, topic: bytes = DEFAULT_TOPIC) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, _SNDHWM)
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"cannot publish KV events on {endpoint}: {exc}") from exc
        self.endpoint = endpoint
        self._topic = topic
        self._seq = 0

    def stored(self, parent: int | None, hashes: Sequence[int], block_size: int) -> None:
        self._send(BlockStored(tuple(hashes), parent, block_size, len(hashes) * block_size))

    def removed(self, hashes: Sequence[int]) -> None:
        self._send(BlockRemoved(tuple(hashes)))

    def cleared(self) -> None:
        self._send(AllCleared())

    def _send(self, event: KvEvent) -> None:
        frames = encode_frames(self._topic, self._seq, time.time(), (event,))
        self._seq += 1
        # Past the high-water mark it is dropped: the subscriber sees the sequence gap.
        with contextlib.suppress(zmq.Again):
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)

    def close(self) -> None:
        self._socket.close(0)
        self._context.term()
