"""One encoder replica's life (docs/design.md), in one process: verify, load, serve, drain.

:meth:`EncoderWorker.run` takes the replica through the start-up sequence every worker shares
(:class:`runtime.workers.replica.ReplicaLife`); this module is its encoder part:

1. verify the artifact folder against the registry's digest (refuse with
   :class:`~runtime.workers.replica.ArtifactRefusedError` before anything is registered);
2. check the port, ``hooks.on_starting(base_url)`` (state ``starting``), heartbeat;
3. load the model on its device (``--device``: CUDA when present with ``auto``;
   ``torch.set_num_threads`` for the cores it owns), start the batcher and the
   HTTP server, warm up over representative shapes (batch sizes x lengths, which also seeds the
   compute-time model) and once through HTTP, then heartbeat ``ready`` and ``hooks.on_ready()``;
4. on SIGTERM/SIGINT: ``draining`` (new requests get 503), wait until no request is in flight or
   the grace period ends (a second signal ends it), stop, delete the heartbeat, ``on_gone``.

The hooks are :class:`~runtime.workers.replica.WorkerHooks`, as for the vLLM supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from runtime.signing import SignatureCheck
from runtime.tls import ServerTLS, TLSConfigError, upstream_context
from runtime.workers.encoder.batcher import BatchPolicy, DynamicBatcher
from runtime.workers.encoder.model import Encoder
from runtime.workers.encoder.server import EncoderService, build_app
from runtime.workers.replica import ReplicaLife, ReplicaSpec, WorkerHooks, WorkerStartError

log = logging.getLogger("switchyard.worker")

WARMUP_LENGTHS = (16, 64)


@dataclass(frozen=True, kw_only=True)
class EncoderSpec:
    artifact_dir: Path
    expected_digest: str | None  # None: not verified (bench and local experiments only)
    expected_files: Mapping[str, str] | None = None
    signature: SignatureCheck | None = None  # the registry's; None: not checked
    model_name: str
    aliases: tuple[str, ...] = ()  # more model names it answers to (same weights)
    host: str = "127.0.0.1"
    port: int
    threads: int = 1
    device: str = "auto"  # auto (CUDA when torch sees one, else CPU), cpu or cuda
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    grace_s: float = 30.0
    heartbeat_ttl_s: float = 15.0
    handle_signals: bool = True
    tls: ServerTLS | None = None  # serve HTTPS; with its client_ca, clients need a cert (mTLS)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"


class EncoderWorker:
    def __init__(
        self, spec: EncoderSpec, *, hooks: WorkerHooks | None = None, redis_url: str | None = None
    ) -> None:
        self.spec = spec
        self._life = ReplicaLife(
            ReplicaSpec(
                name=spec.model_name,
                host=spec.host,
                port=spec.port,
                base_url=spec.base_url,
                artifact_dir=spec.artifact_dir,
                expected_digest=spec.expected_digest,
                expected_files=spec.expected_files,
                signature=spec.signature,
                heartbeat_ttl_s=spec.heartbeat_ttl_s,
                handle_signals=spec.handle_signals,
            ),
            hooks=hooks,
            redis_url=redis_url,
        )
        self.service: EncoderService | None = None

    def request_stop(self) -> None:
        """Begin draining (a second call ends the drain at once). Safe from any thread."""
        self._life.request_stop()

    async def run(self) -> None:
        await self._life.run(self)

    # --- the engine's part of the sequence (runtime.workers.replica.ReplicaEngine) ---------

    def prepare(self) -> None:
        return None

    async def close(self) -> None:
        return None  # serve() stops its batcher and server itself

    async def serve(self, life: ReplicaLife) -> None:
        spec = self.spec
        started = time.monotonic()
        try:
            encoder = await asyncio.to_thread(
                Encoder.load, spec.artifact_dir, threads=spec.threads, device=spec.device
            )
        except (OSError, ValueError) as exc:
            raise WorkerStartError(f"cannot load {spec.artifact_dir}: {exc}") from exc
        run = _runner(encoder)
        batcher = DynamicBatcher(run, policy=spec.policy)
        self.service = service = EncoderService(
            encoder, batcher, model_name=spec.model_name, aliases=spec.aliases
        )
        batcher.observer = service.metrics
        runner = web.AppRunner(build_app(service), access_log=None)
        await runner.setup()
        try:
            try:
                context = None if spec.tls is None else spec.tls.context()
                site = web.TCPSite(runner, spec.host, spec.port, ssl_context=context)
                await site.start()
            except (OSError, TLSConfigError) as exc:
                raise WorkerStartError(f"cannot serve on {spec.base_url}: {exc}") from exc
            batcher.start()
            await asyncio.to_thread(warm_up_shapes, encoder, batcher, spec.policy.max_batch)
            await self._warm_http()
            await life.ready()
            log.info(
                "%s ready at %s after %.1f s (%s, %d threads, cost a=%.4f s b=%.2e s/token)",
                spec.model_name, spec.base_url, time.monotonic() - started, encoder.device,
                spec.threads,
                *batcher.cost.coefficients(),
            )  # fmt: skip
            await life.wait_stop()
            service.draining = True
            await life.draining()
            await self._drain(service, life)
        finally:
            await batcher.stop()
            await runner.cleanup()

    async def _warm_http(self) -> None:
        body = {"model": self.spec.model_name, "input": ["warm up", "the encoder"]}
        url = f"{self.spec.base_url}/v1/embeddings"
        connector = aiohttp.TCPConnector(ssl=upstream_context(os.environ) or True)  # mTLS
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=60)) as resp,
        ):
            if resp.status != 200:
                raise WorkerStartError(f"warmup failed: HTTP {resp.status} {await resp.text()}")

    async def _drain(self, service: EncoderService, life: ReplicaLife) -> None:
        deadline = time.monotonic() + self.spec.grace_s
        while service.in_flight > 0 or service.batcher.waiting > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or life.force.is_set():
                log.warning("stopping with %d request(s) in flight", service.in_flight)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(life.force.wait(), min(0.05, remaining))
        log.info("drained: no request in flight")


def _runner(encoder: Encoder) -> Callable[[str, list[list[int]]], list[list[float]]]:
    def run(task: str, batch: list[list[int]]) -> list[list[float]]:
        return encoder.classify(batch) if task == "classify" else encoder.embed(batch)

    return run


def warm_up_shapes(encoder: Encoder, batcher: DynamicBatcher, max_batch: int) -> None:
    """Run representative shapes once each and feed the compute model (blocking)."""
    lengths = sorted({min(n, encoder.info.max_tokens) for n in WARMUP_LENGTHS})
    sizes = sorted({1, max_batch})
    for length in lengths:
        for size in sizes:
            batch = [[101] + [1000] * (length - 2) + [102] for _ in range(size)]
            began = time.perf_counter()
            encoder.embed(batch)
            batcher.cost.observe(size, length, time.perf_counter() - began)
