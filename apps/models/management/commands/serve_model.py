"""``manage.py serve_model``: run one replica of a registered model version.

Resolves the version (``--label``, default the newest published), checks its artifact folder
against the registry's digest, starts vLLM's OpenAI-compatible server (or, with ``--backend
simulator``, the vLLM simulator), registers the endpoint in ``--pool`` and moves it through
starting → ready → draining → gone with the registry services; SIGTERM or Ctrl-C drains it.
The life cycle itself is :class:`runtime.workers.supervisor.Supervisor`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.models.management.replica import (
    advertised_kv_events,
    artifact_check,
    pool_named,
    published_version,
    registry_hooks,
    replica_arguments,
    serve,
    signature_check,
    worker_tls_from_env,
)
from apps.models.models import ModelVersion
from apps.models.selectors import lora_settings
from runtime.procs import free_port
from runtime.workers.launch import Backend, WorkerSpec
from runtime.workers.supervisor import Supervisor, SupervisorSettings

DEFAULT_MAX_MODEL_LEN = 2048


class Command(BaseCommand):
    help = (
        "Serve a registered model version: verify its artifact's sha256 against the registry "
        "(refuse on a mismatch), start vLLM's OpenAI server (or the simulator), warm it up, "
        "register the endpoint and heartbeat it; on SIGTERM drain in-flight requests for up "
        "to --grace seconds, stop the engine and mark the endpoint gone."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        replica_arguments(parser, example="demo-llama", capacity=8)
        add = parser.add_argument
        add("--device", choices=["cpu", "gpu"], default="cpu", help="vLLM on CPU or GPU.")
        add(
            "--backend",
            choices=["vllm", "simulator"],
            default=None,
            help="Engine (default: the version's runtime; 'simulator' is for tests only).",
        )
        add("--max-model-len", type=int, default=None, help="Default: manifest max_context.")
        add("--start-timeout", type=float, default=900.0, help="Seconds to wait for /health.")
        add("--engine-log", type=Path, default=None, help="Engine output file (default stderr).")
        add("--engine-args", default="", help='Extra engine flags, e.g. "--seed 1" (shlex).')
        add(
            "--kv-events-port",
            type=int,
            default=None,
            help="Port of the engine's KV cache events (ZeroMQ, on --host), announced to the "
            "routers for precise prefix routing (default: a free port; 0: off).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        version = published_version(options["model"], options["label"])
        pool = pool_named(options["pool"])
        backend = self._backend(version, options["backend"])
        for name in ("capacity", "port"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be a positive integer")
        if options["grace"] < 0 or options["start_timeout"] <= 0 or options["heartbeat_ttl"] <= 0:
            raise CommandError("--grace must be >= 0; --start-timeout, --heartbeat-ttl > 0")
        manifest = version.manifest if isinstance(version.manifest, dict) else {}
        max_context = manifest.get("max_context")
        # LoRA on when it has adapters; slots from the pool's policies (max_loras, max_cpu_loras)
        try:
            max_loras, max_cpu_loras, max_lora_rank = lora_settings(version, pool.policies or {})
        except ValueError as exc:
            raise CommandError(f"pool {pool.name!r}: {exc}") from None
        spec = WorkerSpec(
            **artifact_check(version),
            signature=signature_check(version),
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
            tls=(tls := worker_tls_from_env()),
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            max_cpu_loras=max_cpu_loras,
            kv_events_port=self._kv_events_port(options),
        )
        kv_events = advertised_kv_events(spec.host, spec.kv_events_port)
        hooks = registry_hooks(version, pool, options, tls=tls, kv_events_url=kv_events)
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
        self.stdout.write(serve(supervisor.run(), hooks))

    @staticmethod
    def _kv_events_port(options: dict[str, Any]) -> int | None:
        port = options["kv_events_port"]
        if port is None:
            return free_port(options["host"])
        if port < 0:
            raise CommandError("--kv-events-port must be >= 0 (0: no KV events)")
        return port or None

    @staticmethod
    def _backend(version: ModelVersion, requested: str | None) -> Backend:
        if version.runtime == ModelVersion.Runtime.TORCH:
            raise CommandError(
                f"{version} runs on the torch runtime; serve_model runs vLLM (or the simulator)"
            )
        if requested is None:
            requested = version.runtime
        return "simulator" if requested == ModelVersion.Runtime.SIMULATOR else "vllm"
