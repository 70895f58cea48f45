"""What the control plane (Django) and the data plane (routers, workers) agree on, in one place.

Both halves import this module; it imports nothing but the standard library and msgspec.

Redis key layout. Every name lives under a *namespace* (``switchyard`` by default; a test or
benchmark run publishes under a namespace of its own, so runs never share state):

======================================  =========================================================
key                                     what
======================================  =========================================================
``{ns}:snapshot:seq``                   counter; each snapshot publish takes the next number
``{ns}:snapshot:v:{n}``                 the JSON document of snapshot version ``n``
``{ns}:snapshot:latest``                the number of the latest snapshot version
``{ns}:snapshot:announce``              pub/sub channel; each message is a version number
``{ns}:snapshot:confirmed``             ``"<version>:<unix time>"``: version checked current then
``{ns}:apikey:last_used``               hash: API-key prefix -> unix time of its last use
``{ns}:limits:{<tenant>}:rpm|tpm|conc``  a tenant's global RPM / TPM / concurrency (admission)
``{ns}:limits:{<tenant>}:credit``        hash: balance, escrow (micro-credits), day:/month: spend
``{ns}:limits:{<tenant>}:escrow``        hash: lease id -> micro-credits held by that request
``{ns}:limits:{<tenant>}:done:{lease}``  set once a lease is settled (replays are no-ops), 1 h TTL
``{ns}:usage``                          stream of usage events (consumer group ``ledger``)
``{ns}:safety:events``                  stream of safety interventions (consumer group ``audit``)
``{ns}:ledger-lock``                    held while the ledger consumer/reconciler move balances
``{ns}:fairness:{pool}``                hash: ``"<band>|<tenant>"`` -> shared fairness counter
``{ns}:endpoint:{id}:heartbeat``        a worker's heartbeat (TTL; JSON value)
``{ns}:cache:e:{scope}:{ver}:{key}``    a cached result (msgpack :class:`Entry`; TTL)
``{ns}:cache:idx:{scope}`` / ``:sz:``   a scope's entries by expiry / their sizes (byte quota)
``{ns}:cache:lease:{key}``              single-flight lease of the router fetching ``key``
``{ns}:cache:purge``                    pub/sub channel; routers drop L1 on a message
``{ns}:idem:{tenant}:{key digest}``     an ``Idempotency-Key``'s request digest and result (24 h)
``{ns}:scaling:signals:{pool}``         hash: router id -> JSON :class:`PoolSignals` (TTL)
``{ns}:scaling:leader``                 the autoscaler's leader lock (TTL)
``{ns}:scaling:local:{pool}``           hash: endpoint id -> pid (the local actuator)
``{ns}:vstats:{model}|{label}:{bucket}``  hash: a version's counters in one time bucket (rollouts)
``{ns}:live``                           pub/sub channel: each router's live document per second
``{ns}:live:recent``                    capped list of recent live documents (backfill)
``{ns}:live:relay``                     lease of the one dashboard relay forwarding them
``{ns}:live:control``                   the latest staff control document (TTL)
``{ns}:dash:tasks``                     capped list: the dashboard's recently queued actions
======================================  =========================================================

No other module spells a key: they call the functions below (``tests/contracts`` checks it).

The snapshot prefix and the last-use hash can be moved with :data:`ENV_SNAPSHOT_PREFIX` and
:data:`ENV_KEY_USAGE_HASH` (both halves read the same variables); the router derives its limits
and fairness prefixes from the snapshot prefix's namespace (:func:`namespace_of`).

API keys are ``"sy_" + prefix + "_" + secret``: an 8-character public prefix of ``[a-z0-9]``
(the snapshot's lookup key) and a 40-character secret of ``[A-Za-z0-9]``. Only the prefix and
:func:`api_key_digest` (hex sha256 of the whole key) are stored.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
import time
from typing import Final

import msgspec

NAMESPACE: Final = "switchyard"
SNAPSHOT_PREFIX: Final = f"{NAMESPACE}:snapshot"
KEY_USAGE_HASH: Final = f"{NAMESPACE}:apikey:last_used"
LIMITS_PREFIX: Final = f"{NAMESPACE}:limits"
FAIRNESS_PREFIX: Final = f"{NAMESPACE}:fairness"
HEARTBEAT_KEY_PREFIX: Final = f"{NAMESPACE}:endpoint:"

ENV_SNAPSHOT_PREFIX: Final = "SWITCHYARD_SNAPSHOT_PREFIX"
ENV_KEY_USAGE_HASH: Final = "SWITCHYARD_KEY_USAGE_HASH"


def namespace_of(snapshot_prefix: str) -> str:
    """The namespace of a snapshot prefix: ``"x:snapshot"`` -> ``"x"``."""
    return snapshot_prefix.removesuffix(":snapshot")


class SnapshotKeys(msgspec.Struct, frozen=True):
    """The Redis names of the snapshot under one prefix (see the module table)."""

    prefix: str = SNAPSHOT_PREFIX

    @property
    def seq(self) -> str:
        return f"{self.prefix}:seq"

    @property
    def latest(self) -> str:
        return f"{self.prefix}:latest"

    @property
    def channel(self) -> str:
        return f"{self.prefix}:announce"

    @property
    def confirmed(self) -> str:
        return f"{self.prefix}:confirmed"

    @property
    def version_prefix(self) -> str:
        return f"{self.prefix}:v:"

    def version(self, n: int) -> str:
        return f"{self.version_prefix}{n}"


def endpoint_heartbeat_key(endpoint_id: int) -> str:
    """The heartbeat key of an endpoint's worker."""
    return f"{HEARTBEAT_KEY_PREFIX}{endpoint_id}:heartbeat"


def scaling_signals_key(namespace: str, pool: str) -> str:
    """The hash of a pool's scaling signals, one field per router."""
    return f"{namespace}:scaling:signals:{pool}"


def scaling_leader_key(namespace: str) -> str:
    """The lock held by the one autoscaler tick that may act."""
    return f"{namespace}:scaling:leader"


def scaling_local_key(namespace: str, pool: str) -> str:
    """The local actuator's replicas of a pool: endpoint id -> process id."""
    return f"{namespace}:scaling:local:{pool}"


def limits_prefix(namespace: str) -> str:
    """The prefix of every tenant's limit and credit keys under ``namespace``."""
    return f"{namespace}:limits"


def fairness_prefix(namespace: str) -> str:
    """The prefix of the pools' shared fairness hashes under ``namespace``."""
    return f"{namespace}:fairness"


BATCH_LANE: Final = "#batch"
"""A limits subject ``<tenant>#batch``: the tenant's batch lines, admitted under limits of their
own (the batch allowance), never counted against its online RPM/TPM/concurrency."""


def batch_lane(tenant: str) -> str:
    """The limits subject of ``tenant``'s batch lines (a slug never holds ``#``)."""
    return f"{tenant}{BATCH_LANE}"


def lane_tenant(subject: str) -> str:
    """The tenant of a limits subject (itself, or the owner of a batch lane): whose credits."""
    return subject.removesuffix(BATCH_LANE)


def limits_keys(prefix: str, tenant: str) -> tuple[str, str, str]:
    """A limits subject's RPM, TPM and concurrency keys (``{tenant}`` is a cluster hash tag):
    a tenant's, or its batch lane's (``:batch:`` keys in the same slot)."""
    owner = lane_tenant(tenant)
    base = f"{prefix}:{{{owner}}}" + (":batch" if owner != tenant else "")
    return f"{base}:rpm", f"{base}:tpm", f"{base}:conc"


# -- credits (see runtime/admission/credits.py and apps/billing/ledger.py) ---------------------
# ``available = balance - escrow``. ``balance`` is the ledger's balance minus the charges still on
# their way to it (usage events not yet written); ``day:``/``month:`` fields are the credits
# charged in that UTC period (budgets).

USAGE_GROUP: Final = "ledger"
"""The consumer group of the Celery consumer on the usage stream."""


def credit_key(prefix: str, tenant: str) -> str:
    return f"{prefix}:{{{tenant}}}:credit"


def escrow_key(prefix: str, tenant: str) -> str:
    return f"{prefix}:{{{tenant}}}:escrow"


def done_key(prefix: str, tenant: str, lease_id: str) -> str:
    return f"{prefix}:{{{tenant}}}:done:{lease_id}"


def usage_stream(namespace: str) -> str:
    return f"{namespace}:usage"


SAFETY_GROUP: Final = "audit"
"""The consumer group of the Celery consumer on the safety interventions stream."""


def safety_stream(namespace: str) -> str:
    """The stream of safety interventions (refusals, redactions, stops) routers report."""
    return f"{namespace}:safety:events"


def ledger_lock(namespace: str) -> str:
    """Held by the ledger consumer, the reconciler and grants while they change balances."""
    return f"{namespace}:ledger-lock"


def period_fields(now: float | None = None) -> tuple[str, str]:
    """The budget fields of the UTC day and month containing ``now`` (unix seconds)."""
    t = time.gmtime(time.time() if now is None else now)
    return (
        f"day:{t.tm_year:04d}{t.tm_mon:02d}{t.tm_mday:02d}",
        f"month:{t.tm_year:04d}{t.tm_mon:02d}",
    )


def fairness_key(prefix: str, pool: str) -> str:
    """The hash of a pool's shared fairness counters."""
    return f"{prefix}:{pool}"


def cache_entry_key(namespace: str, scope: str, version: str, key: str) -> str:
    """A cached result (scope: a tenant slug or ``*``; version: the version's digest tag)."""
    return f"{namespace}:cache:e:{scope}:{version}:{key}"


def cache_entry_scope(namespace: str, key: str) -> str:
    """The scope of a cached result's key (the inverse of :func:`cache_entry_key`'s first
    field)."""
    return key.removeprefix(f"{namespace}:cache:e:").split(":", 1)[0]


def cache_entry_pattern(namespace: str, scope: str = "*", version: str = "*") -> str:
    """A SCAN pattern of the cached results of a scope and/or a version."""
    return f"{namespace}:cache:e:{scope}:{version}:*"


def cache_index_keys(namespace: str, scope: str) -> tuple[str, str]:
    """A scope's entry index (sorted set by expiry) and size hash (with ``__total``)."""
    return f"{namespace}:cache:idx:{scope}", f"{namespace}:cache:sz:{scope}"


def cache_lease_key(namespace: str, key: str) -> str:
    return f"{namespace}:cache:lease:{key}"


def cache_purge_channel(namespace: str) -> str:
    return f"{namespace}:cache:purge"


def idempotency_key(namespace: str, tenant: str, digest: str) -> str:
    return f"{namespace}:idem:{tenant}:{digest}"


def idempotency_pattern(namespace: str, tenant: str) -> str:
    """A SCAN pattern of a tenant's idempotency records."""
    return f"{namespace}:idem:{tenant}:*"


def version_stats_key(namespace: str, model: str, version: str, bucket: int) -> str:
    """A version's per-bucket counters (``runtime/telemetry/versions.py`` writes them)."""
    return f"{namespace}:vstats:{model}|{version}:{bucket}"


# -- the live dashboard (runtime/telemetry/live.py publishes, frontend/ relays) ----------------


def live_channel(namespace: str) -> str:
    """The pub/sub channel of the routers' live documents."""
    return f"{namespace}:live"


def live_backlog(namespace: str) -> str:
    """The capped list of recent live documents (newest first)."""
    return f"{namespace}:live:recent"


def live_relay_lease(namespace: str) -> str:
    """The lease of the one relay that forwards live documents to browsers."""
    return f"{namespace}:live:relay"


def live_control_key(namespace: str) -> str:
    """The latest staff control document (a string with a TTL)."""
    return f"{namespace}:live:control"


def dashboard_tasks_key(namespace: str) -> str:
    """The dashboard's recently queued actions (a capped list, newest first)."""
    return f"{namespace}:dash:tasks"


# -- API keys ---------------------------------------------------------------------------------

API_KEY_PREFIX_LENGTH: Final = 8
API_KEY_SECRET_LENGTH: Final = 40
API_KEY_PREFIX_ALPHABET: Final = string.ascii_lowercase + string.digits
API_KEY_SECRET_ALPHABET: Final = string.ascii_letters + string.digits
API_KEY_RE: Final = re.compile(
    rf"sy_(?P<prefix>[a-z0-9]{{{API_KEY_PREFIX_LENGTH}}})_[A-Za-z0-9]{{{API_KEY_SECRET_LENGTH}}}"
)


def api_key_digest(full_key: str) -> str:
    """The stored form of a key: hex sha256 of the whole key string (any string hashes)."""
    return hashlib.sha256(full_key.encode("utf-8", "surrogateescape")).hexdigest()


def api_key_prefix(full_key: str) -> str | None:
    """The public prefix of a well-formed key; None for anything else."""
    match = API_KEY_RE.fullmatch(full_key)
    return match.group("prefix") if match else None


def api_key_new_prefix() -> str:
    """A random public prefix (the caller checks it is free)."""
    return "".join(secrets.choice(API_KEY_PREFIX_ALPHABET) for _ in range(API_KEY_PREFIX_LENGTH))


def api_key_new(prefix: str | None = None) -> str:
    """A new full key with ``prefix`` (random when None) and a random secret."""
    prefix = api_key_new_prefix() if prefix is None else prefix
    secret = "".join(secrets.choice(API_KEY_SECRET_ALPHABET) for _ in range(API_KEY_SECRET_LENGTH))
    key = f"sy_{prefix}_{secret}"
    if api_key_prefix(key) != prefix:
        raise ValueError(f"not a valid API-key prefix: {prefix!r}")
    return key
