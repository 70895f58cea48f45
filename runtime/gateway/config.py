"""The router's settings, read once from the environment into a frozen object.

| variable | default | meaning |
|---|---|---|
| ``REDIS_URL`` | ``redis://127.0.0.1:6379/0`` | snapshot, key usage |
| ``SWITCHYARD_SNAPSHOT_PREFIX`` | ``switchyard:snapshot`` | snapshot key prefix |
| ``SWITCHYARD_VAR_DIR`` | ``./var`` | the snapshot's disk copy lives here |
| ``SWITCHYARD_KEY_USAGE_HASH`` | ``switchyard:apikey:last_used`` | API-key last-use hash |
| ``SWITCHYARD_MAX_BODY_BYTES`` | ``1048576`` | request body cap (413 above) |
| ``SWITCHYARD_BODY_TIMEOUT_S`` | ``30`` | the whole body must arrive within this (408) |
| ``SWITCHYARD_CLIENT_WRITE_STALL_S`` | ``30`` | the longest wait for a client not reading |
| ``SWITCHYARD_RETRY_ATTEMPTS`` | ``3`` | upstream attempts before the first byte |
| ``SWITCHYARD_STREAM_MIGRATIONS`` | ``2`` | a broken stream resumes elsewhere this often; 0: off |
| ``SWITCHYARD_CONNECT_TIMEOUT_S`` | ``2`` | connect cap per attempt |
| ``SWITCHYARD_TTFT_TIMEOUT_S`` | ``30`` | first-byte cap per attempt |
| ``SWITCHYARD_DEFAULT_DEADLINE_S`` | ``300`` | deadline when the class gives none |
| ``SWITCHYARD_MAX_DEADLINE_S`` | ``600`` | no request may ask for more |
| ``SWITCHYARD_LIMITS_PREFIX`` | *namespace*``:limits`` | tenant RPM/TPM/concurrency keys |
| ``SWITCHYARD_FAIRNESS_PREFIX`` | *namespace*``:fairness`` | shared fairness counters |
| ``SWITCHYARD_ASSUMED_REPLICAS`` | ``2`` | routers; Redis down: each limit / (this x workers) |
| ``SWITCHYARD_ROUTER_WORKERS`` | ``1`` | worker processes of this router (``--workers`` sets it) |
| ``SWITCHYARD_QUEUE_LIMIT`` | ``1000`` | queue bound of a band no class names |
| ``SWITCHYARD_DEFAULT_BAND`` | ``1`` | priority band of a request without a class |
| ``SWITCHYARD_COALESCE_WINDOW_MS`` | ``2`` | unary (torch) requests coalesce this long; 0: off |
| ``SWITCHYARD_SNAPSHOT_STALE_AFTER_S`` | ``120`` | snapshot older than this is reported stale |
| ``SWITCHYARD_CONTROL_PLANE_URL`` | *(none)* | Batch API: files and batches go there |
| ``SWITCHYARD_INTERNAL_SECRET`` | *(none)* | Batch API: signs the forwarded principal |
| ``SWITCHYARD_MAX_UPLOAD_BYTES`` | ``104857600`` | Batch API: a file upload's cap (413) |
| ``SWITCHYARD_BATCH_CONCURRENCY`` | ``16`` | Batch API: a tenant's batch lines in flight |
| ``SWITCHYARD_SNAPSHOT_CONFIRM_POLL_S`` | ``5`` | how often to read the freshness confirmation |
| ``SWITCHYARD_AT_REST_KEYS`` | *var dir*``/at_rest_keys`` | cache encryption keys, newest first |
| ``SWITCHYARD_AT_REST_KEYS_FILE`` | | a file holding them instead |
| ``SWITCHYARD_ROUTER_HTTP`` | ``asgi`` | HTTP entry: ``asgi`` (pure) or ``channels`` (the A/B) |
| ``SWITCHYARD_UPSTREAM_CLIENT`` | ``lean`` | upstream client: ``lean`` (ours) or ``aiohttp`` |
| ``SWITCHYARD_UPSTREAM_TLS_*`` | unset | https workers: CA, client cert (:mod:`runtime.tls`) |

The *namespace* is the snapshot prefix without a trailing ``:snapshot`` (``switchyard`` by
default), so every deployment (and every test or benchmark run, which publish under a prefix
of their own) keeps its limits and fairness counters apart. The key layout is
:mod:`runtime.contract`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runtime import contract
from runtime.cache.sealing import load_keyring
from runtime.crypto import Keyring, KeyringError
from runtime.tls import ClientTLS, upstream_tls

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SNAPSHOT_PREFIX = contract.SNAPSHOT_PREFIX
KEY_USAGE_HASH = contract.KEY_USAGE_HASH
ENV_WORKERS = "SWITCHYARD_ROUTER_WORKERS"  # set by ``python -m runtime.gateway`` for its workers
HTTP_FLAVOURS = ("asgi", "channels")  # runtime/gateway/routes.py, runtime/gateway/channels_http.py
UPSTREAM_CLIENTS = ("aiohttp", "lean")  # runtime/upstream/choice.py's registry
DEFAULT_UPSTREAM_CLIENT = "lean"  # docs/performance/2026-11-27-upstream-client.md


class ConfigError(ValueError):
    """An environment variable holds a value the router cannot use."""


def _number(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not value >= minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig:
    redis_url: str = DEFAULT_REDIS_URL
    snapshot_prefix: str = DEFAULT_SNAPSHOT_PREFIX
    snapshot_cache_path: Path = Path("var") / "router-snapshot.json"
    key_usage_hash: str = KEY_USAGE_HASH
    key_usage_flush_s: float = 5.0
    max_body_bytes: int = 1 << 20
    body_timeout_s: float = 30.0
    client_write_stall_s: float = 30.0  # consumers.py: a response the client stopped reading
    retry_attempts: int = 3
    retry_backoff_base_s: float = 0.025
    stream_migrations: int = 2  # runtime/gateway/migrate.py: resumes of one broken stream
    retry_backoff_cap_s: float = 0.5
    connect_timeout_s: float = 2.0
    ttft_timeout_s: float = 30.0
    default_deadline_s: float = 300.0
    max_deadline_s: float = 600.0
    health_interval_s: float = 0.25  # a busy engine's gauges are at most this old; an idle one's 4x
    snapshot_retry_s: float = 0.5  # first retry while no snapshot exists; doubles ...
    snapshot_retry_max_s: float = 5.0  # ... up to this
    max_tenant_labels: int = 50
    tokenizer_cache_size: int = 8
    limits_prefix: str = ""  # "" -> namespace + ":limits"
    fairness_prefix: str = ""  # "" -> namespace + ":fairness"
    assumed_replicas: int = 2  # router replicas (machines or pods), each with ``workers``
    workers: int = 1  # this router's worker processes (``--workers``, via the environment)
    lease_ttl_s: float = 30.0
    settle_linger_s: float = 0.25  # runtime/admission: a settlement batch's longest wait
    default_queue_limit: int = 1000
    default_band: int = 1
    dispatch_tick_s: float = 0.05
    fairness_sync_s: float = 0.1
    headroom_window_s: float = 10.0
    coalesce_window_s: float = 0.002  # runtime/batching: 0 turns router-side coalescing off
    snapshot_stale_after_s: float = 120.0
    snapshot_confirm_poll_s: float = 5.0
    scaling_signals_s: float = 1.0  # runtime/scaling: per-pool signals written to Redis
    # runtime/cache/sealing.py: "id:<base64>,..." (newest first), or a file holding it; both
    # "": the var directory's at_rest_keys (generated when missing). Never in the repr.
    at_rest_keys: str = field(default="", repr=False)
    at_rest_keys_file: str = ""
    upstream_tls: ClientTLS | None = None  # https workers: CA and client certificate (mTLS)
    control_plane_url: str = ""  # the Batch API's files and batches ("" -> 503 there)
    internal_secret: str = ""  # signs the principal forwarded to the control plane
    max_upload_bytes: int = 100 << 20  # a Batch API file upload (the 1 MiB cap is not it)
    # The batch allowance: a tenant's batch lines (marked by the executor, signed) in flight at
    # once, in a lane of their own, apart from its online caps (runtime/contract.batch_lane).
    batch_concurrency: int = 16
    router_http: str = "asgi"  # the HTTP entry: "asgi" (pure, the default) or "channels"
    upstream_client: str = (
        DEFAULT_UPSTREAM_CLIENT  # inference requests' client (runtime/upstream/choice.py)
    )

    def __post_init__(self) -> None:
        if self.router_http not in HTTP_FLAVOURS:
            raise ConfigError(
                f"SWITCHYARD_ROUTER_HTTP must be one of {', '.join(HTTP_FLAVOURS)},"
                f" got {self.router_http!r}"
            )
        if self.upstream_client not in UPSTREAM_CLIENTS:
            raise ConfigError(
                f"SWITCHYARD_UPSTREAM_CLIENT must be one of {', '.join(UPSTREAM_CLIENTS)},"
                f" got {self.upstream_client!r}"
            )
        if self.max_body_bytes < 1:
            raise ConfigError("max_body_bytes must be >= 1")
        if self.retry_attempts < 1:
            raise ConfigError("retry_attempts must be >= 1")
        for name in ("connect_timeout_s", "ttft_timeout_s", "default_deadline_s", "body_timeout_s",
                     "client_write_stall_s"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0")
        if self.max_deadline_s < self.default_deadline_s:
            raise ConfigError("max_deadline_s must be >= default_deadline_s")
        for name in ("assumed_replicas", "workers", "default_queue_limit"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if self.default_band < 0:
            raise ConfigError("default_band must be >= 0")

    @property
    def namespace(self) -> str:
        return contract.namespace_of(self.snapshot_prefix)

    @property
    def limit_processes(self) -> int:
        """Router processes that share the tenant limits (replicas x workers): the Redis-down
        fallback gives each process this share of every limit."""
        return self.assumed_replicas * self.workers

    @property
    def var_dir(self) -> Path:
        """The router's data directory (the snapshot's disk copy, the at-rest keys file)."""
        return self.snapshot_cache_path.parent

    @property
    def limits_keys(self) -> str:
        """The Redis key prefix of the tenant limits."""
        return self.limits_prefix or contract.limits_prefix(self.namespace)

    @property
    def fairness_keys(self) -> str:
        """The Redis key prefix of the shared fairness counters."""
        return self.fairness_prefix or contract.fairness_prefix(self.namespace)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RouterConfig:
        env = os.environ if env is None else env
        var_dir = Path(env.get("SWITCHYARD_VAR_DIR") or "var")
        return cls(
            redis_url=env.get("REDIS_URL") or DEFAULT_REDIS_URL,
            snapshot_prefix=env.get(contract.ENV_SNAPSHOT_PREFIX) or DEFAULT_SNAPSHOT_PREFIX,
            snapshot_cache_path=var_dir / "router-snapshot.json",
            key_usage_hash=env.get(contract.ENV_KEY_USAGE_HASH) or KEY_USAGE_HASH,
            max_body_bytes=int(_number(env, "SWITCHYARD_MAX_BODY_BYTES", 1 << 20, minimum=1)),
            body_timeout_s=_number(env, "SWITCHYARD_BODY_TIMEOUT_S", 30.0, minimum=0.001),
            client_write_stall_s=_number(
                env, "SWITCHYARD_CLIENT_WRITE_STALL_S", 30.0, minimum=0.001
            ),
            retry_attempts=int(_number(env, "SWITCHYARD_RETRY_ATTEMPTS", 3, minimum=1)),
            stream_migrations=int(_number(env, "SWITCHYARD_STREAM_MIGRATIONS", 2, minimum=0)),
            connect_timeout_s=_number(env, "SWITCHYARD_CONNECT_TIMEOUT_S", 2.0, minimum=0.001),
            ttft_timeout_s=_number(env, "SWITCHYARD_TTFT_TIMEOUT_S", 30.0, minimum=0.001),
            default_deadline_s=_number(env, "SWITCHYARD_DEFAULT_DEADLINE_S", 300.0, minimum=0.001),
            max_deadline_s=_number(env, "SWITCHYARD_MAX_DEADLINE_S", 600.0, minimum=0.001),
            limits_prefix=env.get("SWITCHYARD_LIMITS_PREFIX") or "",
            fairness_prefix=env.get("SWITCHYARD_FAIRNESS_PREFIX") or "",
            assumed_replicas=int(_number(env, "SWITCHYARD_ASSUMED_REPLICAS", 2, minimum=1)),
            workers=int(_number(env, ENV_WORKERS, 1, minimum=1)),
            default_queue_limit=int(_number(env, "SWITCHYARD_QUEUE_LIMIT", 1000, minimum=1)),
            default_band=int(_number(env, "SWITCHYARD_DEFAULT_BAND", 1, minimum=0)),
            coalesce_window_s=_number(env, "SWITCHYARD_COALESCE_WINDOW_MS", 2.0, minimum=0) / 1000,
            settle_linger_s=_number(env, "SWITCHYARD_SETTLE_LINGER_MS", 250.0, minimum=0) / 1000,
            snapshot_stale_after_s=_number(
                env, "SWITCHYARD_SNAPSHOT_STALE_AFTER_S", 120.0, minimum=0.001
            ),
            snapshot_confirm_poll_s=_number(
                env, "SWITCHYARD_SNAPSHOT_CONFIRM_POLL_S", 5.0, minimum=0.01
            ),
            scaling_signals_s=_number(env, "SWITCHYARD_SCALING_SIGNALS_S", 1.0, minimum=0.05),
            at_rest_keys=env.get("SWITCHYARD_AT_REST_KEYS") or "",
            at_rest_keys_file=env.get("SWITCHYARD_AT_REST_KEYS_FILE") or "",
            upstream_tls=upstream_tls(env),
            control_plane_url=env.get("SWITCHYARD_CONTROL_PLANE_URL") or "",
            internal_secret=env.get("SWITCHYARD_INTERNAL_SECRET") or "",
            max_upload_bytes=int(_number(env, "SWITCHYARD_MAX_UPLOAD_BYTES", 104857600, minimum=1)),
            batch_concurrency=int(_number(env, "SWITCHYARD_BATCH_CONCURRENCY", 16, minimum=1)),
            router_http=(env.get("SWITCHYARD_ROUTER_HTTP") or "asgi").strip().lower(),
            upstream_client=(env.get("SWITCHYARD_UPSTREAM_CLIENT") or DEFAULT_UPSTREAM_CLIENT)
            .strip()
            .lower(),
        )


def at_rest_keyring(config: RouterConfig) -> Keyring:
    """The keyring that seals the cache in Redis (runtime/cache/sealing.py); ConfigError names
    the setting when it cannot be used."""
    if config.at_rest_keys:
        where = "SWITCHYARD_AT_REST_KEYS"
    elif config.at_rest_keys_file:
        where = f"SWITCHYARD_AT_REST_KEYS_FILE={config.at_rest_keys_file}"
    else:
        where = str(config.var_dir / "at_rest_keys")
    try:
        return load_keyring(config.at_rest_keys, config.at_rest_keys_file, config.var_dir)
    except (KeyringError, OSError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
