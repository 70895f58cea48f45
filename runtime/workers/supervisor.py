"""The vLLM worker supervisor (docs/design.md): verify, start, warm up, register, drain, deregister.

:meth:`Supervisor.run` takes one replica through the start-up sequence every worker shares
(:class:`runtime.workers.replica.ReplicaLife`); this module is its vLLM engine part:

1. verify the artifact folder against the registry's digest (:func:`runtime.artifacts.
   verify_artifact`); a mismatch raises :class:`ArtifactRefusedError`, naming the files that
   differ, before anything is registered or launched;
2. ``hooks.on_starting(base_url)`` registers the endpoint (state ``starting``) and returns its id;
3. launch the engine (:mod:`runtime.workers.launch`) in its own process group, heartbeat
   ``switchyard:endpoint:<id>:heartbeat`` in Redis, wait for ``/health``, warm up with one
   1-token completion, then ``hooks.on_ready()``;
4. on SIGTERM/SIGINT (or :meth:`Supervisor.request_stop`): ``hooks.on_draining()``, wait until
   the engine's ``/metrics`` shows no running or waiting request or the grace period ends (a
   second signal ends it at once), stop the engine group (SIGTERM, then SIGKILL after a bound),
   delete the heartbeat, ``hooks.on_gone()``.

While it serves, the supervisor watches the engine's whole process group (the processes it
ran when it turned ready; :meth:`EngineProcess.watch`, every 0.2 s) rather than one output
pipe. When any of them dies: ``hooks.on_unhealthy(reason)`` (the endpoint stops receiving
traffic at once), the rest of the group is stopped, and the engine is started again after a
backoff (1 s, doubling up to 30 s); it is ``ready`` again only after a fresh health check and
warm-up. More than ``max_restarts`` failures within ``restart_window_s`` is a crash loop: the
endpoint goes ``gone`` and :class:`EngineExitedError` says what died and shows the engine's last
output. Every wait is bounded. The hooks are where the control plane comes in (the
``serve_model`` command passes registry services); this module imports no Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import aiohttp

from runtime.tls import upstream_context
from runtime.workers.launch import EngineProcess, WorkerSpec, build_command, build_env
from runtime.workers.probe import EngineStartError, requests_in_flight, wait_healthy, warm_up
from runtime.workers.replica import (
    ArtifactRefusedError,
    NoHooks,
    ReplicaLife,
    ReplicaSpec,
    WorkerError,
    WorkerHooks,
    WorkerStartError,
    check_port_free,
)

__all__ = [
    "ArtifactRefusedError",
    "EngineExitedError",
    "NoHooks",
    "Supervisor",
    "SupervisorSettings",
    "WorkerError",
    "WorkerHooks",
    "WorkerStartError",
    "check_port_free",
]

log = logging.getLogger("switchyard.worker")

_HEALTH_POLL_S = 0.5
_DRAIN_ZERO_READS = 2  # consecutive idle /metrics reads before the engine counts as drained


class EngineExitedError(WorkerError):
    """The engine exited on its own while serving."""


@dataclass(frozen=True, kw_only=True)
class SupervisorSettings:
    start_timeout_s: float = 900.0  # launch -> /health 200 (a big model loads for minutes)
    warmup_timeout_s: float = 120.0
    grace_s: float = 30.0  # draining: how long in-flight requests may still run
    stop_timeout_s: float = 15.0  # SIGTERM -> SIGKILL
    # After a death the rest of the engine is broken: SIGTERM -> SIGKILL this soon. (vLLM's
    # engine core outlived its killed API server by ~10 s on SIGTERM, delaying the restart.)
    dead_stop_timeout_s: float = 1.0
    heartbeat_ttl_s: float = 15.0
    drain_poll_s: float = 0.25
    handle_signals: bool = True  # False when run() is not on the main thread
    # An engine that dies is restarted after restart_backoff_s, doubling up to
    # restart_backoff_max_s; more than max_restarts failures within restart_window_s: give up.
    max_restarts: int = 5
    restart_window_s: float = 600.0
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 30.0
    engine_log: Path | None = None  # the engine's output; None: our stderr


class Supervisor:
    """Runs one engine for ``spec``; see the module docstring for the life cycle."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        hooks: WorkerHooks | None = None,
        redis_url: str | None = None,
        settings: SupervisorSettings | None = None,
    ) -> None:
        self.spec = spec
        self._settings = settings = settings or SupervisorSettings()
        self._life = ReplicaLife(
            ReplicaSpec(
                name=spec.served_model_name,
                host=spec.host,
                port=spec.port,
                base_url=spec.base_url,
                artifact_dir=spec.artifact_dir,
                expected_digest=spec.expected_digest,
                expected_files=spec.expected_files,
                signature=spec.signature,
                heartbeat_ttl_s=settings.heartbeat_ttl_s,
                handle_signals=settings.handle_signals,
                lora=spec.max_loras > 0,
            ),
            hooks=hooks,
            redis_url=redis_url,
        )
        self._files = contextlib.ExitStack()
        self._sink: BinaryIO | None = None
        self.engine: EngineProcess | None = None
        self.ready_after_s: list[float] = []  # launch -> ready, for each engine life

    def request_stop(self) -> None:
        """Begin draining (a second call ends the drain at once). Safe from any thread."""
        self._life.request_stop()

    async def run(self) -> None:
        await self._life.run(self)

    # --- the engine's part of the sequence (runtime.workers.replica.ReplicaEngine) ---------

    def prepare(self) -> None:
        self._sink = self._open_log(self._files)

    async def serve(self, life: ReplicaLife) -> None:
        """Serve until a stop; restart the engine (with backoff) each time it dies."""
        settings = self._settings
        crashes: list[float] = []
        restarting = False
        connector = aiohttp.TCPConnector(ssl=upstream_context(os.environ) or True)  # mTLS
        async with aiohttp.ClientSession(connector=connector) as session:
            while True:
                reason = await self._serve_once(session, life, restarting=restarting)
                if reason is None:
                    return  # stopped (and drained)
                now = time.monotonic()
                crashes = [t for t in crashes if t > now - settings.restart_window_s] + [now]
                if len(crashes) > settings.max_restarts:
                    engine = self.engine
                    raise EngineExitedError(
                        f"the {self.spec.served_model_name} engine failed {len(crashes)} times "
                        f"within {settings.restart_window_s:.0f} s; giving up (at most "
                        f"{settings.max_restarts} restarts). Last: {reason}.\n"
                        f"Last lines of its output:\n{engine.tail() if engine else ''}"
                    )
                delay = min(
                    settings.restart_backoff_s * 2 ** (len(crashes) - 1),
                    settings.restart_backoff_max_s,
                )
                log.warning(
                    "%s; restarting the engine in %.1f s (failure %d, at most %d restarts in "
                    "%.0f s)", reason, delay, len(crashes), settings.max_restarts,
                    settings.restart_window_s,
                )  # fmt: skip
                if await life.stop_requested_within(delay):
                    return
                restarting = True

    async def close(self) -> None:
        """Stop the engine (its group) and close its log. Never raises."""
        engine = self.engine
        if engine is not None:
            try:
                code = await engine.stop(self._settings.stop_timeout_s)
                log.info("engine stopped (exit code %s)", code)
            except Exception:
                log.exception("stopping the engine failed")
        self._files.close()

    async def _serve_once(
        self, session: aiohttp.ClientSession, life: ReplicaLife, *, restarting: bool
    ) -> str | None:
        """One engine life: launch, health, warm-up, ready, then serve until a stop (drain,
        return None) or the death of any engine process (mark the endpoint unhealthy, stop the
        rest of the group, return what died). A restart that does not come up counts as a
        death; the first start's failure raises :class:`WorkerStartError`."""
        spec = self.spec
        started = time.monotonic()
        argv = build_command(spec)
        sink = self._sink
        assert sink is not None, "prepare() opens the engine log before serve()"
        try:
            self.engine = engine = await EngineProcess.start(argv, build_env(spec), sink=sink)
        except OSError as exc:
            raise WorkerStartError(f"cannot launch {argv[0]}: {exc}") from exc
        if restarting:
            await life.restarting()
        try:
            if not await self._start_engine(session, engine, life):
                log.info("stop requested while starting; not serving")
                return None
        except WorkerStartError as exc:
            if not restarting:
                raise
            return f"the restarted engine did not come up: {exc}"
        members = engine.members()
        await life.ready()
        self.ready_after_s.append(time.monotonic() - started)
        log.info(
            "%s ready at %s after %.1f s (engine pid %s, %d process(es))",
            spec.served_model_name, spec.base_url, time.monotonic() - started, engine.pid,
            len(members),
        )  # fmt: skip
        died = await self._serve_until_stop(engine, members, life)
        if died is not None:
            await life.unhealthy(died)  # routers stop sending it traffic at once
            await engine.stop(self._settings.dead_stop_timeout_s)  # the rest of its group
            log.warning("%s: endpoint marked unhealthy, the engine's group stopped", died)
            return died
        await life.draining()
        await self._drain(session, engine, life)
        if engine.returncode is not None:  # it died while draining, before we stopped it
            raise await self._exited(engine)
        return None

    def _open_log(self, files: contextlib.ExitStack) -> BinaryIO:
        path = self._settings.engine_log
        if path is None:
            stderr: BinaryIO | None = getattr(sys.stderr, "buffer", None)
            if stderr is not None:
                return stderr
            path = Path(os.devnull)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return files.enter_context(path.open("ab"))
        except OSError as exc:
            raise WorkerStartError(f"cannot write the engine log {path}: {exc}") from exc

    async def _start_engine(
        self, session: aiohttp.ClientSession, engine: EngineProcess, life: ReplicaLife
    ) -> bool:
        """Wait for health and warm up; False if a stop came first. Raises WorkerStartError."""
        spec, settings = self.spec, self._settings
        try:
            healthy = await wait_healthy(
                session,
                spec.base_url,
                timeout_s=settings.start_timeout_s,
                exited=lambda: engine.returncode,
                interrupted=lambda: life.stop_requested_within(_HEALTH_POLL_S),
            )
            if healthy:
                await warm_up(
                    session,
                    spec.base_url,
                    spec.served_model_name,
                    timeout_s=settings.warmup_timeout_s,
                )
        except EngineStartError as exc:
            await engine.stop(settings.stop_timeout_s)  # so that its log is complete
            raise WorkerStartError(
                f"{spec.served_model_name} did not start: {exc}.\n"
                f"Last lines of the engine's output:\n{engine.tail()}"
            ) from exc
        return healthy

    async def _serve_until_stop(
        self, engine: EngineProcess, members: frozenset[int], life: ReplicaLife
    ) -> str | None:
        """Wait for a stop request (None) or the death of any engine process (what died)."""
        stop = asyncio.create_task(life.wait_stop())
        died = asyncio.create_task(engine.watch(members))
        try:
            await asyncio.wait({stop, died}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stop, died):
                task.cancel()
        return died.result() if died.done() and not died.cancelled() else None

    async def _drain(
        self, session: aiohttp.ClientSession, engine: EngineProcess, life: ReplicaLife
    ) -> None:
        settings = self._settings
        deadline = time.monotonic() + settings.grace_s
        zero_reads = 0
        in_flight: int | None = None
        while engine.returncode is None:
            in_flight = await requests_in_flight(session, self.spec.base_url)
            zero_reads = zero_reads + 1 if in_flight == 0 else 0
            remaining = deadline - time.monotonic()
            if zero_reads >= _DRAIN_ZERO_READS or (in_flight == 0 and remaining <= 0):
                log.info("drained: no request in flight")
                return
            if remaining <= 0 or life.force.is_set():
                reason = "grace period ended" if remaining <= 0 else "second stop signal"
                known = "an unknown number of" if in_flight is None else str(in_flight)
                log.warning("%s with %s request(s) in flight; stopping anyway", reason, known)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(life.force.wait(), min(settings.drain_poll_s, remaining))

    async def _exited(self, engine: EngineProcess) -> EngineExitedError:
        await engine.stop(self._settings.stop_timeout_s)  # the rest of its group, its last output
        return EngineExitedError(
            f"the {self.spec.served_model_name} engine exited on its own with code "
            f"{engine.returncode}.\nLast lines of its output:\n{engine.tail()}"
        )
