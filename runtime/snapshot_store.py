"""Where the runtime snapshot lives in Redis, and the one way to publish it.

Key layout (all under one prefix, ``switchyard:snapshot`` by default; the names are
:class:`runtime.contract.SnapshotKeys`):

- ``{prefix}:seq`` — counter; each publish takes the next number with ``INCR``;
- ``{prefix}:v:{n}`` — the JSON document of version ``n``. A version expires ``ttl_s`` after
  it stops being the latest, and the version ``keep`` publishes back is deleted at once, so
  old versions are pruned; the latest never expires;
- ``{prefix}:latest`` — the number of the latest version. It only moves forward: when two
  publishers race, the one holding the lower number loses and its document is dropped;
- ``{prefix}:announce`` — pub/sub channel; each message is a version number (ASCII);
- ``{prefix}:confirmed`` — ``"{version}:{unix time}"``: the control plane checked at that time
  that version ``version`` still says what the database says (the periodic refresh writes it
  when there was nothing to publish). Routers read it to tell an old-but-current snapshot from
  a stale one (:attr:`runtime.snapshot_loader.SnapshotLoader.age_s`).

Publishing is one Lua script, so the document, the pointer and the announcement change
together. The control plane publishes with the sync client (:func:`publish`); routers read
with :class:`runtime.snapshot_loader.SnapshotLoader`. This module imports nothing from Django.
"""

from __future__ import annotations

import msgspec
import redis

from runtime.contract import SNAPSHOT_PREFIX, SnapshotKeys
from runtime.snapshot import Snapshot, decode, encode, with_version

__all__ = [
    "DEFAULT_PREFIX",
    "KEEP_VERSIONS",
    "VERSION_TTL_S",
    "PublishResult",
    "SnapshotKeys",
    "latest_version",
    "next_version",
    "parse_version",
    "publish",
    "publish_versioned",
    "read_latest",
]

DEFAULT_PREFIX = SNAPSHOT_PREFIX
VERSION_TTL_S = 24 * 3600
KEEP_VERSIONS = 20

# KEYS[1] version key, KEYS[2] latest pointer.
# ARGV[1] version, ARGV[2] document, ARGV[3] ttl seconds, ARGV[4] channel,
# ARGV[5] version-key prefix ("{prefix}:v:"), ARGV[6] versions to keep (0 = no count limit).
# Returns 1 when the pointer moved to this version (and it was announced), 0 when a newer
# version was already the latest (nothing is written).
_PUBLISH_LUA = """
local n = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if n <= current then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
if current > 0 then
  redis.call('EXPIRE', ARGV[5] .. current, tonumber(ARGV[3]))
end
local keep = tonumber(ARGV[6])
if keep > 0 and n - keep > 0 then
  redis.call('DEL', ARGV[5] .. (n - keep))
end
redis.call('PUBLISH', ARGV[4], ARGV[1])
return 1
"""


class PublishResult(msgspec.Struct, frozen=True):
    version: int
    latest: bool  # False: a newer version was already published; this one was dropped


def parse_version(raw: bytes | str | int | None) -> int | None:
    """A version number from the latest pointer or an announcement; None if absent or junk."""
    if raw is None:
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


class Confirmation(msgspec.Struct, frozen=True):
    version: int
    at: float  # unix seconds


def parse_confirmation(raw: bytes | str | None) -> Confirmation | None:
    """The ``{prefix}:confirmed`` value, or None when absent or junk."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    version_text, _, at_text = text.partition(":")
    version = parse_version(version_text)
    try:
        at = float(at_text)
    except ValueError:
        return None
    if version is None or not at > 0:
        return None
    return Confirmation(version=version, at=at)


def confirm(
    client: redis.Redis[bytes], *, version: int, at: float, prefix: str = DEFAULT_PREFIX
) -> None:
    """Record that ``version`` was checked against the database at ``at`` (unix seconds)."""
    client.set(SnapshotKeys(prefix).confirmed, f"{version}:{at:.3f}")


def publish_versioned(
    client: redis.Redis[bytes],
    snapshot: Snapshot,
    *,
    version: int,
    prefix: str = DEFAULT_PREFIX,
    ttl_s: int = VERSION_TTL_S,
    keep: int = KEEP_VERSIONS,
) -> PublishResult:
    """Publish ``snapshot`` stamped with ``version`` (taken earlier with :func:`next_version`)."""
    if version <= 0:
        raise ValueError(f"snapshot version must be positive, got {version}")
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    keys = SnapshotKeys(prefix)
    document = encode(with_version(snapshot, version))
    script = client.register_script(_PUBLISH_LUA)
    moved = script(
        keys=[keys.version(version), keys.latest],
        args=[
            str(version),
            document,
            str(ttl_s),
            keys.channel,
            keys.version_prefix,
            str(max(keep, 0)),
        ],
    )
    return PublishResult(version=version, latest=bool(moved))


def next_version(client: redis.Redis[bytes], *, prefix: str = DEFAULT_PREFIX) -> int:
    """Take the next version number (``INCR {prefix}:seq``)."""
    return int(client.incr(SnapshotKeys(prefix).seq))


def publish(
    client: redis.Redis[bytes],
    snapshot: Snapshot,
    *,
    prefix: str = DEFAULT_PREFIX,
    ttl_s: int = VERSION_TTL_S,
    keep: int = KEEP_VERSIONS,
) -> PublishResult:
    """Take the next version number, stamp it into ``snapshot`` and publish it."""
    version = next_version(client, prefix=prefix)
    return publish_versioned(
        client, snapshot, version=version, prefix=prefix, ttl_s=ttl_s, keep=keep
    )


def latest_version(client: redis.Redis[bytes], *, prefix: str = DEFAULT_PREFIX) -> int | None:
    """The number the latest pointer holds, or None when nothing was published."""
    raw: bytes | str | None = client.get(SnapshotKeys(prefix).latest)
    return parse_version(raw)


def read_latest(client: redis.Redis[bytes], *, prefix: str = DEFAULT_PREFIX) -> Snapshot | None:
    """The latest published snapshot, or None when there is none.

    Raises ``msgspec.ValidationError``/``msgspec.DecodeError`` if the stored document is bad.
    """
    version = latest_version(client, prefix=prefix)
    if version is None:
        return None
    raw: bytes | str | None = client.get(SnapshotKeys(prefix).version(version))
    if raw is None:
        return None
    return decode(raw)
