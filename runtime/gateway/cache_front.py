"""The cache front of the request path (the cache stages call it): idempotency, lookup with
single flight, capture of a miss, replay of a hit. The other stages stay in charge of auth,
limits, escrow and settling.

Per request (chat and completions only; :meth:`CacheFront.begin`):

1. an ``Idempotency-Key`` claims the key or returns the stored answer (served unbilled);
2. a cacheable request (:mod:`.policy`) looks up L1 then L2; on a miss it joins the key's
   flight (:mod:`.flight`): a follower gets the leader's entry, the leader goes upstream;
3. the miss is relayed through a :class:`Capture` sink; once the response completed cleanly
   its entry is stored (L1 + L2), handed to the followers and to the idempotency record.

A tenant with ``zero_retention`` is never looked up nor stored, and its ``Idempotency-Key``
only guards the running request (no answer is recorded: a retry after it ends runs again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.cache.entry import (
    CachedUsage,
    Entry,
    from_stream,
    from_unary,
    parse_sse,
    sse_frames,
    unary_body,
)
from runtime.cache.flight import Flights, Lead
from runtime.cache.idempotency import Hold, IdempotencyStore, check_key
from runtime.cache.metrics import CacheMetrics
from runtime.cache.policy import (
    CACHED_ROUTES,
    cache_key,
    cache_scope,
    cacheable,
    no_store,
    request_digest,
    version_tag,
)
from runtime.cache.sealing import Sealer
from runtime.cache.store import ResultStore, StoreConfig
from runtime.contract import cache_purge_channel
from runtime.crypto import Keyring
from runtime.gateway.relay import SSE_HEADERS, ResponseSink, Usage, end_cut
from runtime.redis_conn import async_client, cancel_and_wait, raise_if_cancelling
from runtime.snapshot import ModelSnap, TenantSnap, VersionSnap

HIT_HEADER = b"x-switchyard-cache"
PURGE_POLL_S = 5.0  # the purge subscription's read timeout (then it reads again)
PURGE_RETRY_S = 1.0  # after the purge subscription failed
logger = logging.getLogger(__name__)


class Capture:
    """A sink that forwards to the client and keeps a copy; after the first request with an
    ``Idempotency-Key`` lost its client (``detached``), it only keeps the copy."""

    def __init__(self, sink: ResponseSink, *, detachable: bool) -> None:
        self.sink = sink
        self.status = 0
        self.chunks: list[bytes] = []
        self.detachable = detachable
        self.gone = False

    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.status = status
        headers = [*headers, (HIT_HEADER, b"miss")]
        await self._forward(self.sink.start_response(status, headers))

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        self.chunks.append(data)
        await self._forward(self.sink.send_chunk(data, last=last))

    async def _forward(self, sending: object) -> None:
        if self.gone:
            sending.close()  # type: ignore[attr-defined]
            return
        try:
            await sending  # type: ignore[misc]
        except Exception:
            if not self.detachable:
                raise
            self.gone = True

    def entry(
        self, kind: str, *, streaming: bool, outcome: str, usage: Usage | None
    ) -> Entry | None:
        if self.status != 200 or outcome not in ("", "ok"):
            return None
        data = b"".join(self.chunks)
        if not streaming:
            return from_unary(kind, data)
        known = CachedUsage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) \
            if usage is not None else None  # fmt: skip
        return from_stream(kind, parse_sse(data), known)


@dataclass(slots=True, kw_only=True)
class CacheJob:
    """One request's dealings with the cache."""

    key: str = ""  # "" when the request is not cacheable
    scope: str = ""
    version: str = ""
    ttl_s: int = 0
    hold: Hold | None = None
    replay: Entry | None = None  # the stored answer of an Idempotency-Key
    lead: Lead | None = None
    capture: Capture | None = None
    served: Entry | None = None  # the entry a hit was answered with
    retain: bool = True  # False: the tenant's zero_retention (no lookup, no store, no record)
    finished: bool = field(default=False)

    @property
    def active(self) -> bool:
        return bool(self.key) or self.hold is not None


async def send_entry(
    sink: ResponseSink, entry: Entry, *, streaming: bool, include_usage: bool,
    headers: Iterable[tuple[bytes, bytes]], cut: Callable[[], str | None] | None = None,
) -> None:  # fmt: skip
    """A stored answer, as JSON or as SSE in OpenAI's framing. A stream cancelled after its
    headers while ``cut()`` names a reason (the router's grace period ended) ends with that
    terminal chunk and ``[DONE]``, as a relayed stream does."""
    if not streaming:
        body = unary_body(entry)
        length = (b"content-length", str(len(body)).encode("ascii"))
        await sink.start_response(200, [(b"content-type", b"application/json"), length, *headers])
        await sink.send_chunk(body, last=True)
        return
    frames = sse_frames(entry, include_usage=include_usage)
    await sink.start_response(200, [*SSE_HEADERS, *headers])
    try:
        await sink.send_chunk(b"".join(frames), last=True)
    except asyncio.CancelledError:
        reason = cut() if cut is not None else None
        if reason is not None:
            await end_cut(sink, kind=entry.kind, reason=reason, chunk_id=entry.id,
                          created=entry.created, model=entry.model)  # fmt: skip
        raise


class CacheFront:
    """The router's cache: one Redis client, the two levels, flights, idempotency records."""

    def __init__(self, redis_url: str, *, namespace: str, metrics: CacheMetrics,
                 keyring: Keyring, config: StoreConfig | None = None) -> None:  # fmt: skip
        # runtime/redis_conn.py: socket timeouts, a retry on a dropped connection, keepalive.
        self._redis: aioredis.Redis[bytes] = async_client(redis_url, name="switchyard-cache")
        self._ns = namespace
        self.metrics = metrics
        sealer = Sealer(keyring, on_unreadable=metrics.unreadable.inc)
        self.store = ResultStore(self._redis, namespace=namespace, config=config or StoreConfig(),
                                 metrics=metrics, sealer=sealer)  # fmt: skip
        self.flights = Flights(self._redis, namespace=namespace, metrics=metrics)
        self.idempotency = IdempotencyStore(self._redis, namespace=namespace, sealer=sealer)
        self._purges: asyncio.Task[None] | None = None

    async def begin(
        self, *, route: str, document: dict[str, object], model: ModelSnap,
        version: VersionSnap, tenant: TenantSnap, cache_control: bytes | None,
        idempotency: bytes | None, deadline: float,
    ) -> CacheJob:  # fmt: skip
        """The request's job; an ``Idempotency-Key`` is claimed (or its answer found) here."""
        job = CacheJob(retain=not tenant.zero_retention)
        if route not in CACHED_ROUTES:
            return job
        if idempotency is not None:
            key = check_key(idempotency)
            digest = request_digest(document, route=route, neutral=())
            claim = await self.idempotency.begin(tenant.slug, key, digest, deadline=deadline)
            if isinstance(claim, Entry):
                self.metrics.replays.inc()
                job.replay = claim
                return job
            job.hold = claim
        if (
            job.retain
            and not no_store(cache_control)
            and cacheable(document, route=route, model=model, version=version, tenant=tenant)
        ):
            job.scope = cache_scope(model, tenant)
            job.version = version_tag(version)
            job.ttl_s = model.cache.ttl_s
            job.key = cache_key(document, route=route, scope=job.scope, version=version)
        return job

    async def lookup(self, job: CacheJob, *, deadline: float) -> Entry | None:
        """The entry of a cacheable request (stored, or fetched by a flight it joined); None
        on a miss, and then ``job.lead`` may be set: this request fetches for the others."""
        if not job.key:
            return None
        entry = await self.store.get(job.scope, job.version, job.key)
        if entry is None:

            async def again() -> Entry | None:
                return await self.store.get(job.scope, job.version, job.key)

            joined = await self.flights.join(job.key, lookup=again, deadline=deadline)
            if isinstance(joined, Lead):
                job.lead = joined
                return None
            entry = joined
        job.served = entry
        return entry

    def sink_for(self, job: CacheJob, sink: ResponseSink) -> ResponseSink:
        """The sink a miss relays through: a capturing one when the answer will be kept."""
        if not job.retain or (job.hold is None and job.lead is None and not job.key):
            return sink  # zero retention: no copy of the answer is kept, even in memory
        job.capture = Capture(sink, detachable=job.hold is not None)
        return job.capture

    async def finish(
        self, job: CacheJob, *, kind: str, streaming: bool, outcome: str, usage: Usage | None
    ) -> None:
        """Store a clean miss's answer and hand it to the followers and the idempotency
        record; release them with None otherwise. Safe to call more than once."""
        if job.finished:
            return
        job.finished = True
        entry = None
        if job.capture is not None:
            entry = job.capture.entry(kind, streaming=streaming, outcome=outcome, usage=usage)
        try:
            if entry is not None and job.key:
                await self.store.put(job.scope, job.version, job.key, entry, ttl_s=job.ttl_s)
        finally:
            if job.lead is not None:
                await job.lead.finish(entry)
            if job.hold is not None:
                await job.hold.finish(entry if entry is not None else job.served)

    def start(self) -> None:
        """Follow the purge channel (a purge clears this router's L1)."""
        if self._purges is None:
            self._purges = asyncio.create_task(self._purge_listener(), name="cache-purges")

    async def _purge_listener(self) -> None:
        while True:
            try:
                await self._follow_purges()
            except (RedisError, OSError, TimeoutError) as exc:
                logger.debug("cache: purge channel lost (%s); L1 cleared, resubscribing", exc)
                self.store.l1.clear()  # a purge may have been missed while disconnected
                await asyncio.sleep(PURGE_RETRY_S)

    async def _follow_purges(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(cache_purge_channel(self._ns))
            while True:
                message = await pubsub.get_message(timeout=PURGE_POLL_S)
                raise_if_cancelling()  # redis-py can swallow a cancellation mid-read
                if message is not None and message.get("type") == "message":
                    self.store.l1.clear()
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[attr-defined]

    async def close(self) -> None:
        task, self._purges = self._purges, None
        if task is not None:
            await cancel_and_wait(task)  # redis-py can swallow a cancellation mid-read
        await self._redis.aclose()  # type: ignore[attr-defined]
