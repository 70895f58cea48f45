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
        replica_arguments(parser, example="minilm", capacity=16)
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
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never a hub
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        spec = EncoderSpec(
            **artifact_check(version),
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
        hooks = registry_hooks(version, pool, options, tls=tls)
        worker = EncoderWorker(spec, hooks=hooks, redis_url=settings.REDIS_URL)
        self.stdout.write(
            f"serving {version} (torch, device {spec.device}, {spec.threads} threads) in {pool}"
        )
        self.stdout.write(serve(worker.run(), hooks))
