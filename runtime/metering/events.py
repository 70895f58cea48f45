"""The usage event: one per request that reached an engine, appended to the usage stream.

The router encodes it at settlement; the settle script appends it to the stream in the same
atomic step that charges the balance, with the amount actually charged beside it (field
``charged``, micro-credits), so the stream and the balances never disagree. The control plane
decodes it into a ``UsageRecord`` (idempotent on ``id``).
"""

from __future__ import annotations

import msgspec


class UsageEvent(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # unique per request (the admission lease id)
    tenant: str
    api_key: str  # key prefix
    version: int
    endpoint: int | None
    tier: str
    request_class: str
    tokens_in: int
    tokens_out: int
    cost_uc: int  # what the tokens cost; the charge (``charged``) can only be lower
    cached: bool
    outcome: str  # "ok" | "error" | "cancelled"
    occurred_at: float  # unix seconds
    queue_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    request_id: str = ""  # the X-Request-Id the client saw (not unique: clients may set it)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(UsageEvent)


def encode_event(event: UsageEvent) -> bytes:
    return _ENCODER.encode(event)


def decode_event(raw: bytes | str) -> UsageEvent:
    """Parse one event; raises ``msgspec.ValidationError`` on a malformed one."""
    return _DECODER.decode(raw)
