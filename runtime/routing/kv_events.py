"""vLLM's KV cache events on the wire: decoding one ZeroMQ message into plain events.

With ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'`` a vLLM
engine publishes, from its engine core, one message per scheduler step that changed its prefix
cache, on a ZeroMQ PUB socket (``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``). A
message is three frames: the topic (``kv_events_config.topic``, empty by default), an 8-byte
big-endian sequence number, and the payload: a msgpack ``KVEventBatch`` encoded by msgspec, i.e.
the batch as an array ``[ts, [event, ...], data_parallel_rank]`` and each event as a map tagged
by its ``type`` (vLLM 0.32; earlier versions encoded events as tagged arrays, also read here):

- ``{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
  ...}``: full blocks the engine cached, a chain that continues ``parent_block_hash``
  (``None``: from the prompt's start);
- ``{"type": "BlockRemoved", "block_hashes", ...}``: blocks evicted from the cache;
- ``{"type": "AllBlocksCleared"}``: the whole cache was dropped (``/reset_prefix_cache``).

A block hash is an ``int`` or, with vLLM's ``sha256`` hashing, ``bytes``; either is kept as is
(:data:`EngineHash`). Trailing fields newer vLLM versions append (``medium``, ``lora_name``,
``group_idx``, ...) are ignored: the decoder reads the fields it needs by name (or position)
rather than through vLLM's own classes (the router does not import vLLM). The simulator
publishes the same messages (:func:`encode_batch`); ``tests/runtime/routing/test_kv_events.py``
decodes vLLM's own encoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

EngineHash = int | bytes

STORED: Final = "BlockStored"
REMOVED: Final = "BlockRemoved"
CLEARED: Final = "AllBlocksCleared"
_SEQ_BYTES: Final = 8

_decoder: Final = msgspec.msgpack.Decoder()
_encoder: Final = msgspec.msgpack.Encoder()


class KvEventDecodeError(ValueError):
    """A message that is not a vLLM KV event batch; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks cached, in chain order, continuing ``parent`` (``None``: the prompt's start)."""

    hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    block_size: int
    tokens: int  # how many token ids the event carried (``len(hashes) * block_size``)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    hashes: tuple[EngineHash, ...]


@dataclass(frozen=True, slots=True)
class AllCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllCleared


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    """One message: its sequence number (``-1`` when it had none), timestamp and events."""

    seq: int
    ts: float
    events: tuple[KvEvent, ...]


def _hash(value: object, where: str) -> EngineHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise KvEventDecodeError(f"{where}: a block hash must be an int or bytes, got {value!r}")
    return value


def _hashes(value: object, where: str) -> tuple[EngineHash, ...]:
    if not isinstance(value, list):
        raise KvEventDecodeError(f"{where}: block_hashes must be a list")
    return tuple(_hash(item, where) for item in value)


_FIELDS: Final = {
    STORED: ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    REMOVED: ("block_hashes",),
}


def _positional(raw: object) -> list[object]:
    """An event as ``[tag, field, ...]`` (from vLLM's tagged map, or its older tagged array)."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise KvEventDecodeError(f"an event map needs a string 'type', got {raw!r:.80}")
        names = _FIELDS.get(tag, ())
        missing = [name for name in names if name not in raw]
        if missing:
            raise KvEventDecodeError(f"{tag} lacks {', '.join(missing)}")
        return [tag, *(raw[name] for name in names)]
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        return raw
    raise KvEventDecodeError(f"an event must be a tagged map or array, got {raw!r:.80}")


def _event(event: object) -> KvEvent | None:
    """One event, or None for an event kind this router does not use (kept forward
    compatible: vLLM may add kinds)."""
    raw = _positional(event)
    tag = raw[0]
    if tag == STORED:
        if len(raw) < 5:
            raise KvEventDecodeError(f"{STORED} has {len(raw) - 1} fields, expected >= 4")
        hashes = _hashes(raw[1], STORED)
        parent = None if raw[2] is None else _hash(raw[2], STORED)
        token_ids, block_size = raw[3], raw[4]
        if not isinstance(token_ids, list):
            raise KvEventDecodeError(f"{STORED}: token_ids must be a list")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise KvEventDecodeError(f"{STORED}: block_size must be a positive int")
        return BlockStored(hashes, parent, block_size, len(token_ids))
    if tag == REMOVED:
        if len(raw) < 2:
            raise KvEventDecodeError(f"{REMOVED} has no block_hashes")
        return BlockRemoved(_hashes(raw[1], REMOVED))
    if tag == CLEARED:
        return AllCleared()
    return None


def decode_payload(payload: bytes, seq: int = -1) -> KvEventBatch:
    """A ``KVEventBatch`` payload (the last frame) as a :class:`KvEventBatch`."""
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"not msgpack: {exc}") from exc
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KvEventDecodeError("a batch must be an array [ts, events, ...]")
    ts = raw[0]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise KvEventDecodeError("a batch's ts must be a number")
    events = tuple(event for event in map(_event, raw[1]) if event is not None)
    return KvEventBatch(seq=seq, ts=float(ts), events=events)


def decode_frames(frames: Sequence[bytes]) -> KvEventBatch:
    """A whole ZeroMQ message: ``[topic, seq, payload]`` (or ``[seq, payload]``, ``[payload]``)."""
    if not frames:
        raise KvEventDecodeError("an empty message")
    seq = -1
    if len(frames) >= 2:
        seq_frame = frames[-2]
        if len(seq_frame) != _SEQ_BYTES:
            raise KvEventDecodeError(f"the sequence frame has {len(seq_frame)} bytes, not 8")
        seq = int.from_bytes(seq_frame, "big", signed=True)
    return decode_payload(frames[-1], seq)


def encode_batch(ts: float, events: Sequence[KvEvent]) -> bytes:
    """The payload vLLM would publish for ``events`` (the simulator's publisher uses it)."""
    raw: list[dict[str, object]] = []
    for event in events:
        if isinstance(event, BlockStored):
            raw.append(
                {
                    "type": STORED,
                    "block_hashes": list(event.hashes),
                    "parent_block_hash": event.parent,
                    "token_ids": [0] * event.tokens,
                    "block_size": event.block_size,
                    "lora_id": None,
                    "medium": "CPU",
                    "lora_name": None,
                }
            )
        elif isinstance(event, BlockRemoved):
            raw.append({"type": REMOVED, "block_hashes": list(event.hashes), "medium": "CPU"})
        else:
            raw.append({"type": CLEARED})
    return _encoder.encode([ts, raw, None])


def encode_frames(topic: bytes, seq: int, ts: float, events: Sequence[KvEvent]) -> list[bytes]:
    """A whole message as :func:`decode_frames` reads it."""
    return [topic, seq.to_bytes(_SEQ_BYTES, "big", signed=True), encode_batch(ts, events)]
