"""``manage.py serve_encoder``: run one replica of a registered encoder (torch runtime) version.

Resolves the version (``--label``, default the newest published), verifies its artifact folder
against the registry's digest, loads it in this process (the PyTorch worker with its dynamic
batcher, :mod:`runtime.workers.encoder`, on ``--device auto|cpu|cuda``), warms it up, registers
the endpoint in ``--pool`` and moves it through starting → ready → draining → gone; SIGTERM or
Ctrl-C drains. The registry hooks are shared with ``serve_model``
(:mod:`apps.models.management.replica`).
"""

from __future__ import annotations

import os
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
    worker_tls_from_env,
)
from apps.models.models import ModelVersion
from runtime.workers.encoder.options import device_argument, policy_arguments, policy_from
from runtime.workers.encoder.worker import EncoderSpec, EncoderWorker


class Command(BaseCommand):
    help = (
        "Serve a registered encoder version (torch runtime) with the PyTorch worker (CPU or CUDA, "
        "--device): verify "
        "its artifact against the registry (refuse on a mismatch), load it, warm it up, register "
        "the endpoint and heartbeat it; on SIGTERM drain for up to --grace seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add("--model", required=True, help="Registry model name, e.g. minilm.")
        add("--label", default=None, help="Version label (default: the newest published).")
        add("--pool", required=True, help="Pool the endpoint joins.")
        add("--port", type=int, required=True, help="Port the worker listens on.")
        add("--host", default="127.0.0.1", help="Address it binds (default 127.0.0.1).")
        add("--base-url", default=None, help="URL routers use (default http://HOST:PORT).")
        add("--capacity", type=int, default=16, help="Concurrent requests routed to it.")
        add("--grace", type=float, default=30.0, help="Drain grace period in seconds.")
        add("--heartbeat-ttl", type=float, default=15.0, help="Heartbeat key TTL in seconds.")
        device_argument(parser)
        policy_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        version = published_version(options["model"], options["label"])
        if version.runtime != ModelVersion.Runtime.TORCH:
            raise CommandError(f"{version} runs on {version.runtime}; use serve_model for it")
        pool = pool_named(options["pool"])
        if options["capacity"] < 1 or options["port"] < 1 or options["threads"] < 1:
            raise CommandError("--capacity, --port and --threads must be positive integers")
        try:
            policy = policy_from(options)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        manifest = version.manifest if isinstance(version.manifest, dict) else {}
        files = manifest.get("files")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never a hub
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        spec = EncoderSpec(
            artifact_dir=artifact_dir(version),
            expected_digest=version.digest,
            expected_files=files if isinstance(files, dict) else None,
            signature=signature_check(version),
            model_name=version.model.name,
            host=options["host"],
            port=options["port"],
            threads=options["threads"],
            device=options["device"],
            policy=policy,
            grace_s=options["grace"],
            heartbeat_ttl_s=options["heartbeat_ttl"],
            tls=(tls := worker_tls_from_env()),
        )
        advertised = advertised_url(options["host"], options["port"], options["base_url"], tls=tls)
        hooks = RegistryHooks(
            pool=pool, version=version, capacity=options["capacity"], base_url=advertised
        )
        worker = EncoderWorker(spec, hooks=hooks, redis_url=settings.REDIS_URL)
        self.stdout.write(
            f"serving {version} (torch, device {spec.device}, {spec.threads} threads) in {pool}"
        )
        self.stdout.write(serve(worker.run(), hooks))
