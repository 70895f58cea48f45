"""What ``serve_model`` and ``serve_encoder`` share: finding the version and pool to serve, the
artifact folder, the advertised URL, and the registry hooks that move the replica's endpoint
through starting -> ready -> draining -> gone with the registry services.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.db import connections
from redis.exceptions import RedisError

from apps.models.models import Endpoint, Model, ModelVersion, Pool
from apps.models.selectors import (
    endpoints_live,
    model_get_by_name,
    model_versions_published,
    trusted_keys_active,
)
from apps.models.services import endpoint_register, endpoint_set_state
from apps.models.services.signing import artifact_refused_record
from runtime import redis_conn
from runtime.procs import watch_lifeline
from runtime.signing import SignatureCheck
from runtime.tls import ServerTLS, TLSConfigError, worker_tls
from runtime.workers.heartbeat import endpoint_heartbeat_key
from runtime.workers.replica import ArtifactRefusedError, WorkerError

log = logging.getLogger("switchyard.worker")


def published_version(model_name: str, label: str | None) -> ModelVersion:
    """The version to serve: ``label``'s (it must be published), else the newest published."""
    model: Model | None = model_get_by_name(model_name)
    if model is None:
        raise CommandError(f"no model named {model_name!r}")
    if label is None:
        version = model_versions_published(model).last()
        if version is None:
            raise CommandError(f"model {model_name!r} has no published version")
        return version
    version = model.versions.select_related("model").filter(label=label).first()
    if version is None:
        raise CommandError(f"model {model_name!r} has no version labelled {label!r}")
    if not version.is_published:
        raise CommandError(f"{version} is not published; publish it before serving it")
    return version


def pool_named(name: str) -> Pool:
    pool = Pool.objects.filter(name=name).first()
    if pool is None:
        raise CommandError(f"no pool named {name!r}")
    return pool


def advertised_url(
    host: str, port: int, base_url: str | None, *, tls: ServerTLS | None = None
) -> str | None:
    """What routers should use: ``base_url``; for a wildcard bind, this host's name; else None
    (the worker's own http(s)://HOST:PORT)."""
    if base_url is None and host in ("0.0.0.0", "::"):  # noqa: S104
        scheme = "https" if tls else "http"
        return f"{scheme}://{socket.gethostname()}:{port}"  # reachable by others
    return base_url


def advertised_kv_events(host: str, port: int | None) -> str:
    """The KV events address routers subscribe to ("" without events): this host's name for
    a wildcard bind, as :func:`advertised_url`."""
    if port is None:
        return ""
    if host in ("0.0.0.0", "::"):  # noqa: S104
        host = socket.gethostname()
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def worker_tls_from_env() -> ServerTLS | None:
    """The replica's HTTPS settings (SWITCHYARD_WORKER_TLS_*, :mod:`runtime.tls`), checked now:
    a missing, expired or mismatched certificate is a CommandError naming it."""
    try:
        tls = worker_tls(os.environ)
        if tls is not None:
            tls.context()
    except TLSConfigError as exc:
        raise CommandError(str(exc)) from exc
    return tls


def replica_arguments(parser: CommandParser, *, example: str, capacity: int) -> None:
    """The options both serve commands take: the version, the pool, where the replica listens,
    how many requests it is sent, how long it drains and how long its heartbeat lives."""
    add = parser.add_argument
    add("--model", required=True, help=f"Registry model name, e.g. {example}.")
    add("--label", default=None, help="Version label (default: the newest published).")
    add("--pool", required=True, help="Pool the endpoint joins.")
    add("--port", type=int, required=True, help="Port the replica listens on.")
    add("--host", default="127.0.0.1", help="Address it binds (default 127.0.0.1).")
    add(
        "--base-url",
        default=None,
        help="URL routers use (default http://HOST:PORT; http://HOSTNAME:PORT for 0.0.0.0).",
    )
    add(
        "--capacity",
        type=int,
        default=capacity,
        help=f"Concurrent requests routed to it (default {capacity}).",
    )
    add("--grace", type=float, default=30.0, help="Drain grace period in seconds.")
    add("--heartbeat-ttl", type=float, default=15.0, help="Heartbeat key TTL in seconds.")


def artifact_check(version: ModelVersion) -> dict[str, Any]:
    """What a replica verifies before it serves: the local artifact folder, the registry's
    digest and the manifest's per-file digests (if any) — a worker spec's ``artifact_dir``,
    ``expected_digest`` and ``expected_files``."""
    manifest = version.manifest if isinstance(version.manifest, dict) else {}
    files = manifest.get("files")
    return {
        "artifact_dir": artifact_dir(version),
        "expected_digest": version.digest,
        "expected_files": files if isinstance(files, dict) else None,
    }


def registry_hooks(
    version: ModelVersion,
    pool: Pool,
    options: dict[str, Any],
    *,
    tls: ServerTLS | None = None,
    kv_events_url: str = "",
) -> RegistryHooks:
    """The hooks that register the replica's endpoint (at the URL routers should use: https
    when it serves TLS; with the address of its KV events, if it publishes them)."""
    advertised = advertised_url(options["host"], options["port"], options["base_url"], tls=tls)
    return RegistryHooks(
        pool=pool,
        version=version,
        capacity=options["capacity"],
        base_url=advertised,
        kv_events_url=kv_events_url,
    )


def serve(main: Coroutine[Any, Any, None], hooks: RegistryHooks) -> str:
    """Run the replica (``main``) until it stops; under ``up``, stop (draining) once ``up`` is
    gone. A worker or registry failure is a CommandError. Returns the closing line."""

    async def closing() -> None:
        try:
            await main
        finally:  # the hooks' connection lives in asgiref's thread: close it there
            await sync_to_async(connections.close_all)()

    watch_lifeline()
    try:
        asyncio.run(closing())
    except ArtifactRefusedError as exc:
        log.error("%s", exc)  # noqa: TRY400 - the message is the whole story, no traceback
        worker = hooks.base_url or socket.gethostname()
        artifact_refused_record(version=hooks.version, worker=worker, reason=str(exc))
        raise CommandError(str(exc)) from exc
    except WorkerError as exc:
        raise CommandError(str(exc)) from exc
    except ValidationError as exc:
        raise CommandError(f"the registry refused the endpoint: {registry_messages(exc)}") from exc
    endpoint = hooks.endpoint
    return f"stopped; endpoint {endpoint.pk if endpoint else '-'} is gone"


def registry_messages(exc: ValidationError) -> str:
    """A registry ValidationError as one line."""
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{field}: {' '.join(errs)}" for field, errs in exc.message_dict.items())
    return " ".join(exc.messages)


SIGNATURE_MODES = ("required", "optional")


def signature_check(version: ModelVersion) -> SignatureCheck:
    """What the worker checks the version's signature with: the registry's active keys, read
    from the registry in the same place as the digest (settings.ARTIFACT_SIGNATURES says
    whether an unsigned version is refused)."""
    mode = settings.ARTIFACT_SIGNATURES
    if mode not in SIGNATURE_MODES:
        raise CommandError(
            f"SWITCHYARD_ARTIFACT_SIGNATURES is {mode!r}; it must be 'required' or 'optional'"
        )
    key = version.signing_key
    return SignatureCheck(
        required=mode == "required",
        key_name=key.name if key is not None else "",
        signature=version.signature,
        trusted=trusted_keys_active(),
    )


def artifact_dir(version: ModelVersion) -> Path:
    """The local folder of a ``file://`` artifact URI; CommandError for anything else."""
    parts = urlsplit(version.artifact_uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
        raise CommandError(
            f"{version} has artifact URI {version.artifact_uri!r}; a replica serves local "
            "folders only (file:///path): copy the artifact to this machine and register that"
        )
    return Path(unquote(parts.path))


def retire_stale_endpoints(base_url: str) -> list[int]:
    """Mark gone the live endpoints at ``base_url`` whose heartbeat key has expired.

    They belong to a worker that died without deregistering (SIGKILL, OOM, a lost machine):
    the supervisor has just checked that nothing listens on its port, and a live worker keeps
    its heartbeat from the moment it launches its engine. While Redis cannot be read nothing is
    retired, and registering then fails with the registry's "already serves" message.
    """
    client = redis_conn.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    retired: list[int] = []
    try:
        for endpoint in endpoints_live().filter(base_url=base_url):
            if client.exists(endpoint_heartbeat_key(endpoint.pk)):
                continue
            endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.GONE)
            log.warning("endpoint %s at %s had no heartbeat: marked gone", endpoint.pk, base_url)
            retired.append(endpoint.pk)
    except RedisError as exc:
        log.warning("cannot read heartbeats (%s); not retiring stale endpoints", exc)
    finally:
        client.close()
    return retired


class RegistryHooks:
    """Supervisor hooks that move the endpoint through the registry services."""

    def __init__(
        self,
        *,
        pool: Pool,
        version: ModelVersion,
        capacity: int,
        base_url: str | None,
        kv_events_url: str = "",
    ) -> None:
        self.pool = pool
        self.version = version
        self.capacity = capacity
        self.base_url = base_url
        self.kv_events_url = kv_events_url
        self.endpoint: Endpoint | None = None

    async def on_starting(self, base_url: str) -> int | None:
        self.endpoint = await sync_to_async(self._register)(self.base_url or base_url)
        return self.endpoint.pk

    def _register(self, base_url: str) -> Endpoint:
        retire_stale_endpoints(base_url.rstrip("/"))
        return endpoint_register(
            actor=None,
            pool=self.pool,
            version=self.version,
            base_url=base_url,
            capacity=self.capacity,
            kv_events_url=self.kv_events_url,
        )

    async def on_ready(self) -> None:
        await self._set(Endpoint.State.READY)

    async def on_draining(self) -> None:
        await self._set(Endpoint.State.DRAINING)

    async def on_unhealthy(self, reason: str) -> None:
        # Draining takes it out of routing now (the snapshot is republished on commit); the
        # supervisor restarts the engine and on_ready brings it back after a fresh warm-up.
        log.warning("engine failure (%s): endpoint taken out of routing", reason)
        await self._set(Endpoint.State.DRAINING)

    async def on_gone(self) -> None:
        await self._set(Endpoint.State.GONE)

    async def _set(self, state: str) -> None:
        if self.endpoint is not None:
            await sync_to_async(endpoint_set_state)(actor=None, endpoint=self.endpoint, state=state)
