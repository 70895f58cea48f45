"""``Idempotency-Key`` with Stripe's semantics, scoped to the tenant and kept 24 hours.

The first request with a key records the digest of its request (route + whole document) as
*running*, runs, and records its answer (*done*). A later request with the same key gets:
the stored answer when its digest matches (a stream replays), 400 ``idempotency_key_reused``
when it does not, and while the first is still running it waits for the answer, up to its own
deadline (409 ``idempotency_key_in_progress`` then). A first request that fails (or whose
answer cannot be stored) forgets the key, so a retry runs afresh. Only the first is billed.

Records are sealed with the tenant's key (:mod:`.sealing`), the Redis key as associated data;
one that does not open (its key left the keyring) is forgotten and the key claimed afresh.
A tenant with ``zero_retention`` keeps only the claim while the first request runs: its
answer is never stored (:meth:`Hold.finish` is given None), so a later retry runs again.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis

from runtime.cache.entry import Entry
from runtime.cache.sealing import Sealer
from runtime.contract import idempotency_key
from runtime.gateway.errors import ApiError

TTL_S = 24 * 3600
MAX_KEY_LENGTH = 255


class _Record(msgspec.Struct, kw_only=True):
    digest: str
    done: bool = False
    entry: Entry | None = None


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(_Record)


def check_key(raw: bytes) -> str:
    """The header's key; 400 ``invalid_header`` for an empty, overlong or non-ASCII one."""
    try:
        key = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        key = ""
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise ApiError.of(
            "invalid_header",
            header="Idempotency-Key",
            reason=f"must be 1 to {MAX_KEY_LENGTH} printable ASCII characters.",
        )
    return key


@dataclass(slots=True)
class Hold:
    """The first request's claim on a key: :meth:`finish` with its answer, or None."""

    store: IdempotencyStore
    tenant: str
    name: str
    digest: str

    async def finish(self, entry: Entry | None) -> None:
        if entry is None:
            await self.store.redis.delete(self.name)
            return
        record = _Record(digest=self.digest, done=True, entry=entry)
        await self.store.redis.set(self.name, self.store.seal(record, self.tenant, self.name),
                                   ex=TTL_S)  # fmt: skip


class IdempotencyStore:
    def __init__(
        self, client: aioredis.Redis[bytes], *, namespace: str, sealer: Sealer,
        poll_s: float = 0.02,
    ) -> None:  # fmt: skip
        self.redis = client
        self._ns = namespace
        self.sealer = sealer
        self.poll_s = poll_s

    def seal(self, record: _Record, tenant: str, name: str) -> bytes:
        return self.sealer.seal(_ENC.encode(record), tenant, name)

    async def begin(self, tenant: str, key: str, digest: str, *, deadline: float) -> Entry | Hold:
        """The stored answer, or the hold of the first request (see the module)."""
        name = idempotency_key(self._ns, tenant, hashlib.sha256(key.encode()).hexdigest())
        loop = asyncio.get_running_loop()
        claim = self.seal(_Record(digest=digest), tenant, name)
        while True:
            if await self.redis.set(name, claim, nx=True, ex=TTL_S):
                return Hold(self, tenant, name, digest)
            sealed = await self.redis.get(name)
            if sealed is None:
                continue  # the first failed and forgot it: claim it
            raw = self.sealer.open(sealed, tenant, name)
            if raw is None:  # sealed with a key the ring no longer holds: unreadable, forgotten
                await self.redis.delete(name)
                continue
            record = _DEC.decode(raw)
            if record.digest != digest:
                raise ApiError.of("idempotency_key_reused")
            if record.done and record.entry is not None:
                return record.entry
            if loop.time() + self.poll_s >= deadline:
                raise ApiError.of("idempotency_key_in_progress")
            await asyncio.sleep(self.poll_s)
