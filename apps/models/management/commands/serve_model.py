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
    RegistryHooks,
    advertised_url,
    artifact_dir,
    pool_named,
    published_version,
    serve,
    signature_check,
)
from apps.models.models import ModelVersion
from apps.models.selectors import lora_settings
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
        version = published_version(options["model"], options["label"])
        pool = pool_named(options["pool"])
        backend = self._backend(version, options["backend"])
        for name in ("capacity", "port"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be a positive integer")
        if options["grace"] < 0 or options["start_timeout"] <= 0 or options["heartbeat_ttl"] <= 0:
            raise CommandError("--grace must be >= 0; --start-timeout, --heartbeat-ttl > 0")
        manifest = version.manifest if isinstance(version.manifest, dict) else {}
        files = manifest.get("files")
        max_context = manifest.get("max_context")
        max_loras, max_lora_rank = lora_settings(version)  # LoRA on when it has adapters
        spec = WorkerSpec(
            artifact_dir=artifact_dir(version),
            expected_digest=version.digest,
            expected_files=files if isinstance(files, dict) else None,
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
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
        )
        advertised = advertised_url(options["host"], options["port"], options["base_url"])
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
        self.stdout.write(serve(supervisor.run(), hooks))

    @staticmethod
    def _backend(version: ModelVersion, requested: str | None) -> Backend:
        if version.runtime == ModelVersion.Runtime.TORCH:
            raise CommandError(
                f"{version} runs on the torch runtime; serve_model runs vLLM (or the simulator)"
            )
        if requested is None:
            requested = version.runtime
        return "simulator" if requested == ModelVersion.Runtime.SIMULATOR else "vllm"
