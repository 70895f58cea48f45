"""``Idempotency-Key`` with Stripe's semantics, scoped to the tenant; an answer is kept 24 hours.

The first request with a key records the digest of its request (route + whole document) as
*running* (its *claim*), runs, and records its answer (*done*, kept :data:`TTL_S`). A later
request with the same key gets:
the stored answer when its digest matches (a stream replays), 400 ``idempotency_key_reused``
when it does not, and while the first is still running it waits for the answer, up to its own
deadline (409 ``idempotency_key_in_progress`` then). A first request that fails (or whose
answer cannot be stored) forgets the key, so a retry runs afresh. Only the first is billed.

A claim lapses by itself :data:`CLAIM_MARGIN_S` after its owner's deadline (its Redis TTL), so
a claim nobody forgets (the owner's router was killed, or Redis failed the delete) holds
retries up until then (at most the router's longest deadline and a minute), not a day, with no
renewal and no other work per request: the request's deadline bounds the owner's work (the
queue, every upstream attempt, the relay of its stream, a migration), the margin covers what
follows it (the terminal chunk, settling, storing the answer: Redis calls under their socket
timeouts). A waiter claims the key within a poll (``poll_s``) of its lapse. An owner forgets
only its own claim (compared, then deleted, in one script), so an owner that outlived its claim
cannot delete a retry's. A client that stops reading is dropped after the router's
``client_write_stall_s`` (30 s, below the margin); not covered: one that keeps reading a
trickle, too slowly for the router to write the last bytes within the margin, keeps that owner
running past its claim.

Records are sealed with the tenant's key (:mod:`.sealing`), the Redis key as associated data;
one that does not open (its key left the keyring) is forgotten and the key claimed afresh.
A tenant with ``zero_retention`` keeps only the claim while the first request runs: its
answer is never stored (:meth:`Hold.finish` is given None), so a later retry runs again.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis

from runtime.cache.entry import Entry
from runtime.cache.sealing import Sealer
from runtime.contract import idempotency_key
from runtime.gateway.errors import ApiError

TTL_S = 24 * 3600  # a done record (the stored answer)
CLAIM_MARGIN_S = 60.0  # a running claim lapses this long after its owner's deadline
MAX_KEY_LENGTH = 255
# Forget a claim only while it is still this owner's (the sealed claim is unique: its nonce).
_FORGET = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0"""


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
    claim: bytes  # the sealed running record, as written

    async def finish(self, entry: Entry | None) -> None:
        if entry is None:
            await self.store.forget(self.name, self.claim)
            return
        record = _Record(digest=self.digest, done=True, entry=entry)
        await self.store.redis.set(self.name, self.store.seal(record, self.tenant, self.name),
                                   ex=TTL_S)  # fmt: skip


class IdempotencyStore:
    def __init__(
        self, client: aioredis.Redis[bytes], *, namespace: str, sealer: Sealer,
        poll_s: float = 0.02, claim_margin_s: float = CLAIM_MARGIN_S,
    ) -> None:  # fmt: skip
        self.redis = client
        self._ns = namespace
        self.sealer = sealer
        self.poll_s = poll_s
        self.claim_margin_ms = math.ceil(claim_margin_s * 1000) + 1  # + 1: the truncation below
        self._forget = client.register_script(_FORGET)

    async def forget(self, name: str, claim: bytes) -> None:
        """Delete the claim at ``name`` if it is still ``claim`` (not a later one's)."""
        await self._forget(keys=[name], args=[claim])

    def seal(self, record: _Record, tenant: str, name: str) -> bytes:
        return self.sealer.seal(_ENC.encode(record), tenant, name)

    async def begin(self, tenant: str, key: str, digest: str, *, deadline: float) -> Entry | Hold:
        """The stored answer, or the hold of the first request (see the module)."""
        name = idempotency_key(self._ns, tenant, hashlib.sha256(key.encode()).hexdigest())
        loop = asyncio.get_running_loop()
        claim = self.seal(_Record(digest=digest), tenant, name)
        while True:
            # the claim lapses claim_margin_ms after this request's deadline (see the module)
            lapse_ms = max(0, int((deadline - loop.time()) * 1000)) + self.claim_margin_ms
            if await self.redis.set(name, claim, nx=True, px=lapse_ms):
                return Hold(self, tenant, name, digest, claim)
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
