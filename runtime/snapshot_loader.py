"""Keeps a router's copy of the runtime snapshot current.

:class:`SnapshotLoader` loads the latest snapshot from Redis at start, follows the announce
channel and swaps ``current`` atomically (one attribute assignment on the event loop) on every
newer version, and keeps the last good snapshot on local disk so a router can start — and keep
serving — while Redis or the control plane is down.

Rules:

- Only a newer version replaces the current one, except when Redis itself says its latest is
  older than ours (Redis lost its data and the sequence restarted): Redis is the authority then.
- A bad document (not JSON, wrong shape, other schema, version mismatch) is logged and ignored;
  the last good snapshot stays.
- When the connection drops the follower reconnects with capped exponential backoff and, once
  subscribed again, re-reads the latest pointer, so versions announced while it was away are
  not missed.
- Staleness: the snapshot in force is *fresh as of* its build time, or the later time the
  control plane confirmed that version still matches the database (``{prefix}:confirmed``,
  read every ``confirm_poll_s`` while following). Older than ``stale_after_s`` it is *stale*:
  the router keeps serving it (nothing better exists) but says so in ``/metrics``
  (``switchyard_snapshot_age_seconds``, ``switchyard_snapshot_stale``) and ``/readyz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.redis_conn import async_client, cancel_and_wait, raise_if_cancelling
from runtime.snapshot import SCHEMA_VERSION, Snapshot, decode
from runtime.snapshot_store import (
    DEFAULT_PREFIX,
    SnapshotKeys,
    parse_confirmation,
    parse_version,
)

logger = logging.getLogger(__name__)

SwapCallback = Callable[[Snapshot], None]

_CONNECTION_ERRORS = (RedisError, OSError, TimeoutError)


class SnapshotUnavailableError(RuntimeError):
    """No snapshot could be loaded: not from Redis, and not from the disk copy."""


class BadSnapshotError(ValueError):
    """A stored snapshot document that does not decode or does not fit."""


def _parse(raw: bytes | str, *, expect_version: int | None) -> Snapshot:
    try:
        snapshot = decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadSnapshotError(f"invalid snapshot document: {exc}") from exc
    if snapshot.schema != SCHEMA_VERSION:
        raise BadSnapshotError(
            f"snapshot schema {snapshot.schema} is not the supported schema {SCHEMA_VERSION}"
        )
    if expect_version is not None and snapshot.version != expect_version:
        raise BadSnapshotError(
            f"document under version {expect_version} says it is version {snapshot.version}"
        )
    return snapshot


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


class SnapshotLoader:
    """Loads, follows and caches the runtime snapshot for one router process."""

    def __init__(
        self,
        redis_url: str,
        cache_path: Path,
        prefix: str = DEFAULT_PREFIX,
        *,
        connect_timeout_s: float = 1.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 1.0,  # a refused reconnect is cheap; a late one delays revocations
        health_check_interval_s: int = 15,
        client_name: str = "switchyard-snapshot-loader",
        on_swap: Iterable[SwapCallback] = (),
        stale_after_s: float = 120.0,
        confirm_poll_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s}")
        self._redis_url = redis_url
        self._cache_path = Path(cache_path)
        self._keys = SnapshotKeys(prefix)
        self._connect_timeout_s = connect_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._health_check_interval_s = health_check_interval_s
        self._client_name = client_name
        self._callbacks: list[SwapCallback] = list(on_swap)
        self._current: Snapshot | None = None
        self._changed = asyncio.Condition()
        self._client: aioredis.Redis[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self.source: str | None = None  # "redis" or "disk": where the first snapshot came from
        self.stale_after_s = stale_after_s
        self._confirm_poll_s = confirm_poll_s
        self._clock = clock
        self._fresh_as_of = 0.0  # unix time the current snapshot was last known to be current
        self._warned_stale = False

    # -- reading ---------------------------------------------------------------------------

    @property
    def current(self) -> Snapshot:
        """The snapshot in force. Raises before :meth:`start` has loaded one."""
        if self._current is None:
            raise SnapshotUnavailableError("no snapshot loaded yet; call start() first")
        return self._current

    def loaded(self) -> Snapshot | None:
        """The snapshot in force, or None before :meth:`start` has loaded one (one call, for
        readers on the request path)."""
        return self._current

    @property
    def version(self) -> int | None:
        return None if self._current is None else self._current.version

    @property
    def fresh_as_of(self) -> float | None:
        """Unix time the snapshot in force was last known to match the database."""
        return None if self._current is None else self._fresh_as_of

    def age_s(self) -> float | None:
        """Seconds since :attr:`fresh_as_of` (None before a snapshot is loaded)."""
        if self._current is None:
            return None
        return max(0.0, self._clock() - self._fresh_as_of)

    @property
    def stale(self) -> bool:
        """True when the snapshot in force is older than ``stale_after_s`` (or missing)."""
        age = self.age_s()
        return age is None or age > self.stale_after_s

    def _note_staleness(self) -> None:
        """Log once when the snapshot turns stale, and once when it is fresh again."""
        stale = self.stale
        if stale != self._warned_stale and self._current is not None:
            if stale:
                logger.warning(
                    "snapshot: version %s is stale (%.0fs since last known current; bound %.0fs)",
                    self.version,
                    self.age_s() or 0.0,
                    self.stale_after_s,
                )
            else:
                logger.warning("snapshot: version %s is current again", self.version)
            self._warned_stale = stale

    def add_swap_callback(self, callback: SwapCallback) -> None:
        """Call ``callback(snapshot)`` after every swap (on the event loop; keep it quick)."""
        self._callbacks.append(callback)

    async def wait_for_version(self, version: int, timeout_s: float) -> Snapshot:
        """Wait until the current snapshot is at least ``version``.

        Raises ``TimeoutError`` after ``timeout_s`` seconds.
        """
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(
                lambda: self._current is not None and self._current.version >= version
            )
        return self.current

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the latest snapshot (Redis, else the disk copy) and start following Redis.

        Raises :class:`SnapshotUnavailableError` when neither source has a usable snapshot.
        """
        if self._task is not None:
            raise RuntimeError("SnapshotLoader already started")
        # retries=0: a dropped pub/sub connection must surface here, so the follower re-reads
        # the latest pointer and cannot miss an announcement.
        self._client = async_client(
            self._redis_url,
            name=self._client_name,
            timeout_s=max(self._connect_timeout_s, 5.0),
            connect_timeout_s=self._connect_timeout_s,
            retries=0,
            health_check_interval_s=self._health_check_interval_s,
        )
        redis_problem: str
        try:
            async with asyncio.timeout(self._connect_timeout_s * 3):
                redis_problem = await self._load_from_redis(self._client)
        except _CONNECTION_ERRORS as exc:
            redis_problem = f"Redis unreachable at {self._redis_url}: {exc!r}"
        if self._current is None:
            logger.warning("snapshot: %s; trying the disk copy %s", redis_problem, self._cache_path)
            try:
                await self._load_from_disk()
            except SnapshotUnavailableError as exc:
                await self._close_client()
                raise SnapshotUnavailableError(f"{redis_problem}; {exc}") from None
        self._task = asyncio.create_task(self._follow_forever(), name="snapshot-follower")

    async def stop(self) -> None:
        """Stop following Redis and close connections. ``current`` stays readable."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)  # redis-py can swallow a cancellation mid-read
        await self._close_client()

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose

    # -- sources ---------------------------------------------------------------------------

    async def _load_from_redis(self, client: aioredis.Redis[bytes]) -> str:
        """Swap in Redis's latest; returns why not when nothing usable is there."""
        latest = parse_version(await client.get(self._keys.latest))
        if latest is None:
            return f"no snapshot published at {self._keys.latest}"
        if not await self._fetch_and_swap(client, latest, allow_older=True):
            return f"latest snapshot {latest} in Redis is missing or invalid"
        self.source = "redis"
        return ""

    async def _load_from_disk(self) -> None:
        try:
            raw = await asyncio.to_thread(self._cache_path.read_bytes)
        except FileNotFoundError:
            raise SnapshotUnavailableError(
                f"no disk copy of the snapshot at {self._cache_path}"
            ) from None
        except OSError as exc:
            raise SnapshotUnavailableError(
                f"cannot read the disk copy {self._cache_path}: {exc}"
            ) from None
        try:
            snapshot = _parse(raw, expect_version=None)
        except BadSnapshotError as exc:
            raise SnapshotUnavailableError(
                f"disk copy {self._cache_path} is unusable: {exc}"
            ) from None
        await self._swap(snapshot, raw=None)
        self.source = "disk"
        logger.warning("snapshot: serving version %d from the disk copy", snapshot.version)

    async def _fetch_and_swap(
        self, client: aioredis.Redis[bytes], version: int, *, allow_older: bool
    ) -> bool:
        """GET version ``version``, validate and swap it in. False when missing or bad."""
        raw: bytes | None = await client.get(self._keys.version(version))
        if raw is None:
            logger.warning("snapshot: version %d is not in Redis (pruned or lost)", version)
            return False
        try:
            snapshot = _parse(raw, expect_version=version)
        except BadSnapshotError as exc:
            logger.error("snapshot: ignoring version %d: %s", version, exc)  # noqa: TRY400
            return False
        current = self._current
        if current is not None and snapshot.version <= current.version:
            if not allow_older or snapshot.version == current.version:
                return True
            logger.warning(
                "snapshot: Redis's latest is %d, older than ours (%d): Redis lost its data; "
                "following Redis",
                snapshot.version,
                current.version,
            )
        await self._swap(snapshot, raw=raw)
        return True

    async def _swap(self, snapshot: Snapshot, *, raw: bytes | None) -> None:
        async with self._changed:
            self._current = snapshot
            self._fresh_as_of = snapshot.created_at
            self._changed.notify_all()
        logger.info("snapshot: now at version %d", snapshot.version)
        for callback in self._callbacks:
            try:
                callback(snapshot)
            except Exception:
                logger.exception("snapshot swap callback %r failed", callback)
        if raw is not None:
            try:
                await asyncio.to_thread(_write_atomically, self._cache_path, raw)
            except OSError:
                logger.exception("snapshot: could not write the disk copy %s", self._cache_path)

    # -- following -------------------------------------------------------------------------

    async def _follow_forever(self) -> None:
        backoff = self._backoff_initial_s
        while True:
            synced = asyncio.Event()
            try:
                await self._follow_once(synced)
            except _CONNECTION_ERRORS as exc:
                logger.warning("snapshot: lost Redis (%r); reconnecting in ~%.1fs", exc, backoff)
            except Exception:
                # Never stop following: a router on a frozen snapshot is worse than a noisy log.
                logger.exception("snapshot: follower failed; restarting in ~%.1fs", backoff)
            raise_if_cancelling()
            self._note_staleness()
            if synced.is_set():
                backoff = self._backoff_initial_s
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
            backoff = min(backoff * 2, self._backoff_max_s)

    async def _follow_once(self, synced: asyncio.Event) -> None:
        """Subscribe, catch up with the latest pointer, then apply announcements until an error."""
        client = self._client
        if client is None:
            raise RuntimeError("SnapshotLoader is stopped")
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self._keys.channel)
            await self._catch_up(client)
            synced.set()
            loop = asyncio.get_running_loop()
            next_confirm = loop.time()
            while True:
                if loop.time() >= next_confirm:
                    await self._read_confirmation(client)
                    self._note_staleness()
                    next_confirm = loop.time() + self._confirm_poll_s
                message = await pubsub.get_message(timeout=min(5.0, self._confirm_poll_s))
                raise_if_cancelling()
                if message is None or message.get("type") != "message":
                    continue
                announced = parse_version(message.get("data"))
                if announced is None:
                    logger.error(
                        "snapshot: ignoring malformed announcement %r", message.get("data")
                    )
                    continue
                await self._on_announcement(client, announced)
        finally:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                await pubsub.aclose()  # type: ignore[attr-defined]

    async def _read_confirmation(self, client: aioredis.Redis[bytes]) -> None:
        confirmed = parse_confirmation(await client.get(self._keys.confirmed))
        if confirmed is not None and confirmed.version == self.version:
            self._fresh_as_of = max(self._fresh_as_of, confirmed.at)

    async def _catch_up(self, client: aioredis.Redis[bytes]) -> None:
        latest = parse_version(await client.get(self._keys.latest))
        if latest is not None and latest != self.version:
            await self._fetch_and_swap(client, latest, allow_older=True)

    async def _on_announcement(self, client: aioredis.Redis[bytes], announced: int) -> None:
        current = self.version
        if current is not None and announced <= current:
            if announced < current:
                # Either a stale message, or Redis was reset and its sequence restarted.
                await self._catch_up(client)
            return
        if not await self._fetch_and_swap(client, announced, allow_older=False):
            # Pruned before we got to it, or bad: the latest pointer may hold something newer.
            latest = parse_version(await client.get(self._keys.latest))
            if latest is not None and latest != announced and latest > (self.version or 0):
                await self._fetch_and_swap(client, latest, allow_older=False)
