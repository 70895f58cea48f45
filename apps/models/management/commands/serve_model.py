"""``manage.py serve_model``: run one replica of a registered model version.

Resolves the version (``--label``, default the newest published), checks its artifact folder
against the registry's digest, starts vLLM's OpenAI-compatible server (or, with ``--backend
simulator``, the vLLM simulator), registers the endpoint in ``--pool`` and moves it through
starting → ready → draining → gone with the registry services; SIGTERM or Ctrl-C drains it.
The life cycle itself is :class:`runtime.workers.supervisor.Supervisor`.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import socket
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from redis.exceptions import RedisError

from apps.models.models import Endpoint, Model, ModelVersion, Pool
from apps.models.selectors import endpoints_live, model_get_by_name, model_versions_published
from apps.models.services import endpoint_register, endpoint_set_state
from runtime.procs import watch_lifeline
from runtime.workers.heartbeat import endpoint_heartbeat_key
from runtime.workers.launch import Backend, WorkerSpec
from runtime.workers.supervisor import Supervisor, SupervisorSettings, WorkerError

DEFAULT_MAX_MODEL_LEN = 2048
log = logging.getLogger("switchyard.worker")


def _messages(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{field}: {' '.join(errs)}" for field, errs in exc.message_dict.items())
    return " ".join(exc.messages)


def artifact_dir(version: ModelVersion) -> Path:
    """The local folder of a ``file://`` artifact URI; CommandError for anything else."""
    parts = urlsplit(version.artifact_uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
        raise CommandError(
            f"{version} has artifact URI {version.artifact_uri!r}; serve_model serves local "
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
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
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
        self, *, pool: Pool, version: ModelVersion, capacity: int, base_url: str | None
    ) -> None:
        self.pool = pool
        self.version = version
        self.capacity = capacity
        self.base_url = base_url
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


class Command(BaseCommand):
    help = (
        "Serve a registered model version: verify its artifact's sha256 against the registry "
        "(refuse on a mismatch), start vLLM's OpenAI server (or the simulator), warm it up, "
        "register the endpoint and heartbeat it; on SIGTERM drain in-flight requests for up "
        "to --grace seconds, stop the engine and mark the endpoint gone."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add("--model", required=True, help="Registry model name, e.g. demo-llama.")
        add("--label", default=None, help="Version label (default: the newest published).")
        add("--pool", required=True, help="Pool the endpoint joins.")
        add("--port", type=int, required=True, help="Port the engine listens on.")
        add("--host", default="127.0.0.1", help="Address the engine binds (default 127.0.0.1).")
        add(
            "--base-url",
            default=None,
            help="URL routers use (default http://HOST:PORT; http://HOSTNAME:PORT for 0.0.0.0).",
        )
        add("--device", choices=["cpu", "gpu"], default="cpu", help="vLLM on CPU or GPU.")
        add(
            "--backend",
            choices=["vllm", "simulator"],
            default=None,
            help="Engine (default: the version's runtime; 'simulator' is for tests only).",
        )
        add("--capacity", type=int, default=8, help="Concurrent sequences (default 8).")
        add("--max-model-len", type=int, default=None, help="Default: manifest max_context.")
        add("--grace", type=float, default=30.0, help="Drain grace period in seconds.")
        add("--start-timeout", type=float, default=900.0, help="Seconds to wait for /health.")
        add("--heartbeat-ttl", type=float, default=15.0, help="Heartbeat key TTL in seconds.")
        add("--engine-log", type=Path, default=None, help="Engine output file (default stderr).")
        add("--engine-args", default="", help='Extra engine flags, e.g. "--seed 1" (shlex).')

    def handle(self, *args: Any, **options: Any) -> None:
        version = self._version(options["model"], options["label"])
        pool = Pool.objects.filter(name=options["pool"]).first()
        if pool is None:
            raise CommandError(f"no pool named {options['pool']!r}")
        backend = self._backend(version, options["backend"])
        for name in ("capacity", "port"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be a positive integer")
        if options["grace"] < 0 or options["start_timeout"] <= 0 or options["heartbeat_ttl"] <= 0:
            raise CommandError("--grace must be >= 0; --start-timeout, --heartbeat-ttl > 0")
        manifest = version.manifest if isinstance(version.manifest, dict) else {}
        files = manifest.get("files")
        max_context = manifest.get("max_context")
        spec = WorkerSpec(
            artifact_dir=artifact_dir(version),
            expected_digest=version.digest,
            expected_files=files if isinstance(files, dict) else None,
            served_model_name=version.model.name,
            host=options["host"],
            port=options["port"],
            device=options["device"],
            backend=backend,
            max_model_len=options["max_model_len"]
            or (max_context if isinstance(max_context, int) and max_context > 0 else None)
            or DEFAULT_MAX_MODEL_LEN,
            max_num_seqs=options["capacity"],
            tensor_parallel_size=version.tensor_parallel_size,
            extra_args=tuple(shlex.split(options["engine_args"])),
        )
        advertised = options["base_url"]
        if advertised is None and options["host"] in ("0.0.0.0", "::"):  # noqa: S104
            advertised = f"http://{socket.gethostname()}:{options['port']}"  # reachable by others
        hooks = RegistryHooks(
            pool=pool, version=version, capacity=options["capacity"], base_url=advertised
        )
        supervisor = Supervisor(
            spec,
            hooks=hooks,
            redis_url=settings.REDIS_URL,
            settings=SupervisorSettings(
                start_timeout_s=options["start_timeout"],
                grace_s=options["grace"],
                heartbeat_ttl_s=options["heartbeat_ttl"],
                engine_log=options["engine_log"],
            ),
        )
        self.stdout.write(f"serving {version} ({backend}, {options['device']}) in pool {pool}")
        watch_lifeline()  # under `up`: stop (draining) once `up` is gone
        try:
            asyncio.run(self._supervise(supervisor))
        except WorkerError as exc:
            raise CommandError(str(exc)) from exc
        except ValidationError as exc:
            raise CommandError(f"the registry refused the endpoint: {_messages(exc)}") from exc
        endpoint = hooks.endpoint
        self.stdout.write(f"stopped; endpoint {endpoint.pk if endpoint else '-'} is gone")

    @staticmethod
    async def _supervise(supervisor: Supervisor) -> None:
        try:
            await supervisor.run()
        finally:  # the hooks' connection lives in asgiref's thread: close it there
            await sync_to_async(connections.close_all)()

    def _version(self, model_name: str, label: str | None) -> ModelVersion:
        model: Model | None = model_get_by_name(model_name)
        if model is None:
            raise CommandError(f"no model named {model_name!r}")
        published = model_versions_published(model)
        if label is None:
            version = published.last()
            if version is None:
                raise CommandError(f"model {model_name!r} has no published version")
            return version
        version = model.versions.select_related("model").filter(label=label).first()
        if version is None:
            raise CommandError(f"model {model_name!r} has no version labelled {label!r}")
        if not version.is_published:
            raise CommandError(f"{version} is not published; publish it before serving it")
        return version

    @staticmethod
    def _backend(version: ModelVersion, requested: str | None) -> Backend:
        if version.runtime == ModelVersion.Runtime.TORCH:
            raise CommandError(
                f"{version} runs on the torch runtime; serve_model runs vLLM (or the simulator)"
            )
        if requested is None:
            requested = version.runtime
        return "simulator" if requested == ModelVersion.Runtime.SIMULATOR else "vllm"
