"""One replica's start-up sequence, shared by every worker (docs/design.md): the vLLM supervisor
(:mod:`runtime.workers.supervisor`) and the encoder worker (:mod:`runtime.workers.encoder`).

:meth:`ReplicaLife.run` takes a replica through its life, the same for every kind of engine:

1. **verify** the registry's signature over the artifact's digest (:mod:`runtime.signing`:
   unsigned when required, an untrusted key or a bad signature raises
   :class:`ArtifactRefusedError`), then the artifact folder against that digest (a mismatch
   raises it too, naming the files that differ), before anything is registered or started;
   no digest: not verified, said in the log;
2. check the port is free and let the engine **prepare** (open its log): a failure refuses
   before anything is registered;
3. **register**: ``hooks.on_starting(base_url)`` (state ``starting``) returns the endpoint id,
   whose heartbeat key (``switchyard:endpoint:<id>:heartbeat``) is written from then on;
4. the engine's :meth:`ReplicaEngine.serve` starts and **warms up** its engine, then calls
   :meth:`ReplicaLife.ready` (heartbeat ``ready``, ``hooks.on_ready()``), serves until
   :meth:`ReplicaLife.wait_stop`, calls :meth:`ReplicaLife.draining` (heartbeat ``draining``,
   ``hooks.on_draining()``) and **drains** (bounded by its grace; :attr:`ReplicaLife.force`,
   set by a second stop, ends it at once). An engine that restarts after a death says
   :meth:`ReplicaLife.unhealthy` and :meth:`ReplicaLife.restarting` in between;
5. **gone**, whatever happened after registering: the engine's :meth:`ReplicaEngine.close`,
   the heartbeat deleted, ``hooks.on_gone()``.

SIGTERM/SIGINT (or :meth:`ReplicaLife.request_stop`) begins the drain; a second one ends it.
This module imports no Django: the hooks are where the control plane comes in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from runtime.artifacts import ArtifactError, ArtifactMismatchError, verify_artifact
from runtime.procs import port_is_free
from runtime.signing import SignatureCheck, SignatureError, check_signature
from runtime.workers.adapter_loader import engine_adapters
from runtime.workers.heartbeat import Heartbeat, endpoint_heartbeat_key

log = logging.getLogger("switchyard.worker")


class WorkerError(Exception):
    """The worker could not serve; the message says why."""


class ArtifactRefusedError(WorkerError):
    """The artifact's signature is missing or does not verify, or the artifact is missing or
    differs from the registry's digest: nothing was started."""


class WorkerStartError(WorkerError):
    """The engine could not be started (port taken, exited, unhealthy, warmup failed)."""


class WorkerHooks(Protocol):
    """Control-plane callbacks around the engine's life. ``on_gone`` runs only after
    ``on_starting`` returned, whatever happened after it."""

    async def on_starting(self, base_url: str) -> int | None:
        """Register the endpoint (state starting); return its id for the heartbeat key."""
        ...

    async def on_ready(self) -> None: ...

    async def on_draining(self) -> None: ...

    async def on_unhealthy(self, reason: str) -> None:
        """An engine process died: stop routing to the endpoint now (it restarts and comes
        back through ``on_ready`` after a fresh warm-up)."""
        ...

    async def on_gone(self) -> None: ...


class NoHooks:
    """Hooks that register nothing (tests, a bare engine)."""

    async def on_starting(self, base_url: str) -> int | None:
        return None

    async def on_ready(self) -> None:
        return None

    async def on_draining(self) -> None:
        return None

    async def on_unhealthy(self, reason: str) -> None:
        return None

    async def on_gone(self) -> None:
        return None


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`WorkerStartError` if something already listens on ``host:port``."""
    error = port_is_free(port, host)
    if error is not None:
        raise WorkerStartError(
            f"cannot serve on {host}:{port}: {error.strerror or error}; "
            "stop whatever uses that port or choose another --port"
        ) from error


@dataclass(frozen=True, kw_only=True)
class ReplicaSpec:
    """What the sequence needs to know of a replica, whatever its engine."""

    name: str  # the served model's name (log lines, refusals)
    host: str
    port: int
    base_url: str  # where the worker itself reaches its engine (registered unless hooks say)
    artifact_dir: Path
    expected_digest: str | None  # None: not verified (bench and local experiments only)
    expected_files: Mapping[str, str] | None = None
    signature: SignatureCheck | None = None  # None: not checked (no registry: bench, tests)
    heartbeat_ttl_s: float = 15.0
    handle_signals: bool = True  # False when run() is not on the main thread
    lora: bool = False  # the engine loads LoRA adapters: its heartbeat lists the resident ones


class ReplicaEngine(Protocol):
    """A worker's own part of the sequence (see the module docstring)."""

    def prepare(self) -> None:
        """Before registering: what can fail cheaply (opening a log). Raises WorkerStartError."""
        ...

    async def serve(self, life: ReplicaLife) -> None:
        """Start, warm up, ``life.ready()``, serve until ``life.wait_stop()``,
        ``life.draining()``, drain; return (or raise a WorkerError)."""
        ...

    async def close(self) -> None:
        """Stop whatever :meth:`serve` left running; never raises."""
        ...


class ReplicaLife:
    """The shared sequence for one replica; the engine's part is a :class:`ReplicaEngine`."""

    def __init__(
        self, spec: ReplicaSpec, *, hooks: WorkerHooks | None = None, redis_url: str | None = None
    ) -> None:
        self.spec = spec
        self.hooks: WorkerHooks = hooks or NoHooks()
        self._redis_url = redis_url
        self.stop = asyncio.Event()
        self.force = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat: Heartbeat | None = None

    # --- stopping ------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin draining (a second call ends the drain at once). Safe from any thread."""
        loop = self._loop
        if loop is None:
            self.stop.set()  # before run(): it returns right after verifying
        elif loop.is_running():
            loop.call_soon_threadsafe(self._on_stop_request)

    def _on_stop_request(self, sig: signal.Signals | None = None) -> None:
        if sig is not None:
            log.info("received %s", sig.name)
        if self.stop.is_set():
            self.force.set()
        self.stop.set()

    async def wait_stop(self) -> None:
        await self.stop.wait()

    async def stop_requested_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        return self.stop.is_set()

    # --- the sequence --------------------------------------------------------------------

    async def run(self, engine: ReplicaEngine) -> None:
        self._loop = loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if self.spec.handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_stop_request, sig)
                installed.append(sig)
        try:
            await self._run(engine)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def _run(self, engine: ReplicaEngine) -> None:
        spec = self.spec
        await self.verify()
        if self.stop.is_set():
            return
        check_port_free(spec.host, spec.port)
        engine.prepare()
        endpoint_id = await self.hooks.on_starting(spec.base_url)
        try:
            if self._redis_url is not None and endpoint_id is not None:
                self._heartbeat = Heartbeat(
                    self._redis_url,
                    endpoint_heartbeat_key(endpoint_id),
                    ttl_s=spec.heartbeat_ttl_s,
                    fields={
                        "endpoint": endpoint_id,
                        "base_url": spec.base_url,
                        "pid": os.getpid(),
                        "started": round(time.time(), 6),  # a restarted engine: a new one
                    },
                    extra=partial(engine_adapters, spec.base_url) if spec.lora else None,
                )
                await self._heartbeat.start("starting")
            await engine.serve(self)
        finally:
            await self._gone(engine)

    async def verify(self) -> None:
        spec = self.spec
        if spec.expected_digest is None:
            log.warning("serving %s without verifying its artifact", spec.artifact_dir)
            return
        what = f"refusing to serve {spec.name}"
        if spec.signature is not None:
            try:
                signer = check_signature(spec.signature, spec.expected_digest)
            except SignatureError as exc:
                raise ArtifactRefusedError(f"{what}: {exc}") from exc
            if signer is None:
                log.warning("%s is not signed; serving it (signatures are optional)", spec.name)
            else:
                log.info("signature of %s by key %r verified", spec.name, signer)
        try:
            await asyncio.to_thread(
                verify_artifact, spec.artifact_dir, spec.expected_digest, spec.expected_files
            )
        except ArtifactMismatchError as exc:
            raise ArtifactRefusedError(
                f"{what}: the artifact in {spec.artifact_dir} does not match the registry: {exc}"
            ) from exc
        except (ArtifactError, OSError) as exc:
            raise ArtifactRefusedError(f"{what}: {exc}") from exc
        log.info("artifact %s verified (digest %s)", spec.artifact_dir, spec.expected_digest)

    # --- the states the engine reports -----------------------------------------------------

    async def ready(self) -> None:
        await self._beat("ready")
        await self.hooks.on_ready()

    async def draining(self) -> None:
        await self._beat("draining")
        await self.hooks.on_draining()

    async def unhealthy(self, reason: str) -> None:
        """An engine process died: out of routing now; the engine restarts (or gives up)."""
        await self._beat("restarting")
        await self.hooks.on_unhealthy(reason)

    async def restarting(self) -> None:
        """A fresh engine is starting after a death (ready again only after its warm-up):
        a new ``started`` in the heartbeat (the router forgets the adapters it held)."""
        await self._beat("starting", started=round(time.time(), 6))

    async def _beat(self, state: str, **fields: object) -> None:
        if self._heartbeat is not None:
            await self._heartbeat.set_state(state, **fields)

    async def _gone(self, engine: ReplicaEngine) -> None:
        """Stop the engine, delete the heartbeat, mark the endpoint gone. Never raises."""
        await engine.close()
        if self._heartbeat is not None:
            await self._heartbeat.stop()
            self._heartbeat = None
        try:
            await self.hooks.on_gone()
        except Exception:
            log.exception("marking the endpoint gone failed; its heartbeat is deleted")
