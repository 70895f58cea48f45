"""The local actuator: replicas are worker processes on this machine.

What runs for a replica is chosen by name from the version's runtime
(:mod:`apps.scaling.actuators.launchers`): ``manage.py serve_model`` (vLLM),
``manage.py serve_encoder`` (PyTorch encoders), or the bare simulator. Each is started in its
own process group (:func:`runtime.procs.spawn`). Under ``switchyard up`` it outlives the Celery
process that started it and stops once ``up`` is gone (``SWITCHYARD_EXIT_WITH_PID``,
:func:`runtime.procs.watch_lifeline`); elsewhere ``death_signal`` ties it to that Celery
process (:func:`apps.scaling.tasks.actuator_from_env` chooses). The real workers register
their own endpoint and move it to ``ready`` after their warm-up; the actuator waits for that.
For the simulator the actuator waits for ``/health`` and registers it through the registry
services. A replica is ``ready`` (routed) or *warm* (loaded, not routed: ``starting`` for the
simulator, ``draining`` for a real worker, which takes itself to ``ready``).

Each replica it started is recorded in Redis (``{ns}:scaling:local:{pool}``: endpoint id ->
``{"pid", "port", "warm"}``), so whichever process runs the next tick, and ``manage.py
stop_replicas`` at ``up``'s shutdown, can find it. A recorded replica whose process is gone (its
pid dead, or reused by a process without its ``--port``) is taken out: endpoint -> ``gone``,
record dropped, and the controller starts a replacement if the pool needs one.

Scale-in drains the least loaded routed replica it started (by its engine's running + waiting
requests; a replica someone else runs is never stopped): endpoint -> ``draining`` (routers stop
sending to it on the next snapshot), wait until the engine has nothing in flight, SIGTERM (a real
worker drains for its grace period and stops its engine), endpoint -> ``gone``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from apps.models.models import Endpoint, ModelVersion, Pool
from apps.models.services.fleet import endpoint_register, endpoint_set_state
from apps.scaling.actuators.base import Actuation, ActuatorError, Replicas, StartTime
from apps.scaling.actuators.launchers import Launcher, LaunchSpec, launcher_for_runtime
from apps.scaling.models import PoolScaling
from config.paths import SOURCE_ROOT
from runtime import redis_conn
from runtime.contract import scaling_local_key
from runtime.procs import (
    StartError,
    cmdline,
    free_port,
    log_tail,
    pid_alive,
    signal_group,
    spawn,
    wait_http,
)
from runtime.scaling.controller import Plan
from runtime.tls import TLSConfigError, upstream_context, worker_tls

LIVE = (Endpoint.State.STARTING, Endpoint.State.READY)
WARM_STATES = (Endpoint.State.STARTING, Endpoint.State.DRAINING)
POLL_S = 0.2


def engine_load(
    base_url: str, *, timeout: float = 2.0, context: ssl.SSLContext | None = None
) -> float:
    """Running + waiting requests from a vLLM-compatible ``/metrics`` (inf when unreachable);
    ``context``: an https replica's (runtime.tls.upstream_context: CA, client certificate)."""
    try:
        with urllib.request.urlopen(  # noqa: S310
            f"{base_url}/metrics", timeout=timeout, context=context
        ) as resp:
            text = resp.read().decode()
    except OSError:
        return float("inf")
    total = 0.0
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            total += float(line.rpartition(" ")[2])
    return total


@dataclass(frozen=True, slots=True)
class Record:
    """One replica the actuator started (kept in Redis)."""

    pid: int
    port: int
    warm: bool = False

    def encode(self) -> str:
        return json.dumps({"pid": self.pid, "port": self.port, "warm": self.warm})

    @classmethod
    def decode(cls, raw: bytes | str) -> Record:
        data = json.loads(raw)
        return cls(int(data["pid"]), int(data["port"]), bool(data.get("warm", False)))

    @property
    def alive(self) -> bool:
        """Its process runs (a reused pid runs without our ``--port``)."""
        return pid_alive(self.pid) and f"--port {self.port}" in cmdline(self.pid)


class LocalActuator:
    name = "local"

    def __init__(
        self,
        *,
        redis_url: str,
        namespace: str,
        log_dir: Path,
        capacity: int | None = None,
        engine_args: Sequence[str] = (),
        start_timeout_s: float | None = None,
        drain_timeout_s: float = 60.0,
        grace_s: float = 5.0,
        env: Mapping[str, str] | None = None,
        death_signal: int | None = None,
        launchers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``capacity`` / ``start_timeout_s`` None: the launcher's; ``env``: the replicas'
        environment (default ours); ``launchers``: runtime -> launcher name overrides."""
        self._redis = redis_conn.from_url(redis_url)
        self._namespace = namespace
        self._log_dir = log_dir
        self._capacity = capacity
        self._engine_args = tuple(engine_args)
        self._start_timeout_s = start_timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._grace_s = grace_s
        self._env = dict(env) if env is not None else None
        self._death_signal = death_signal
        self._launchers = dict(launchers or {})
        self._clock = clock
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # ours: reaped on stop
        self._client_tls: ssl.SSLContext | None = None  # made on first use (engine_load)

    def _replica_env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def _replica_url(self, launcher: Launcher, port: int) -> str:
        """Where the replica answers: https when it registers itself (serve_model,
        serve_encoder) and SWITCHYARD_WORKER_TLS_* are set (`up --tls`), else http."""
        try:
            tls = launcher.registers_itself and worker_tls(self._replica_env()) is not None
        except TLSConfigError as exc:
            raise ActuatorError(str(exc)) from exc
        return f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    def _load(self, endpoint: Endpoint) -> float:
        context = None
        if endpoint.base_url.startswith("https:"):
            if self._client_tls is None:
                self._client_tls = upstream_context(self._replica_env())
            context = self._client_tls
        return engine_load(endpoint.base_url, context=context)

    # -- what runs ----------------------------------------------------------------------

    def _key(self, pool: Pool) -> str:
        return scaling_local_key(self._namespace, pool.name)

    def records(self, pool: Pool) -> dict[int, Record]:
        """Endpoint id -> the replica this actuator started for ``pool``."""
        out: dict[int, Record] = {}
        for field, raw in self._redis.hgetall(self._key(pool)).items():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                out[int(field)] = Record.decode(raw)
        return out

    def _record(self, pool: Pool, endpoint: Endpoint, record: Record) -> None:
        self._redis.hset(self._key(pool), str(endpoint.pk), record.encode())

    def reconcile(self, pool: Pool) -> dict[int, Record]:
        """The records of replicas still running; a dead one's endpoint is marked gone."""
        records = self.records(pool)
        for endpoint_id, record in list(records.items()):
            if record.alive:
                continue
            child = self._children.pop(record.pid, None)
            if child is not None:
                child.poll()  # reap it
            endpoint = Endpoint.objects.filter(pk=endpoint_id).first()
            if endpoint is not None and endpoint.state != Endpoint.State.GONE:
                endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.GONE)
            self._redis.hdel(self._key(pool), str(endpoint_id))
            del records[endpoint_id]
        return records

    def _live(self, pool: Pool) -> list[Endpoint]:
        return list(Endpoint.objects.filter(pool=pool, state__in=LIVE).order_by("id"))

    def _warm(self, pool: Pool, records: dict[int, Record]) -> list[Endpoint]:
        ids = [i for i, r in records.items() if r.warm]
        found = Endpoint.objects.filter(pool=pool, id__in=ids, state__in=WARM_STATES)
        return list(found.order_by("id"))

    def observe(self, pool: Pool) -> Replicas:
        """Serving: ready endpoints, plus routed replicas of ours whose process runs while their
        endpoint is out of routing — a worker restarting its engine (``draining`` until its
        fresh warm-up); counting it as gone would start a second cold replica beside it."""
        records = self.reconcile(pool)
        serving = sum(1 for e in self._live(pool) if e.state == Endpoint.State.READY)
        routed = [i for i, r in records.items() if not r.warm]
        recovering = Endpoint.objects.filter(
            pool=pool, id__in=routed, state__in=(Endpoint.State.STARTING, Endpoint.State.DRAINING)
        ).count()
        return Replicas(serving=serving + recovering, warm=len(self._warm(pool, records)))

    def _version(self, pool: Pool) -> ModelVersion:
        """What the pool runs: the version of its last endpoint, else the one its scaling
        settings name (a pool that never ran, such as ``up``'s demo pools)."""
        last = Endpoint.objects.filter(pool=pool).select_related("version__model").last()
        if last is not None:
            return last.version
        scaling = PoolScaling.objects.filter(pool=pool).select_related("version__model").first()
        if scaling is not None and scaling.version is not None:
            return scaling.version
        raise ActuatorError(
            f"pool {pool.name}: no endpoint ever registered and no version in its scaling "
            "settings; no version to run"
        )

    # -- actions ------------------------------------------------------------------------

    def start(
        self, pool: Pool, *, routed: bool, version: ModelVersion | None = None
    ) -> tuple[Endpoint, StartTime]:
        """Start one replica of ``version`` (default: the pool's current one), ready when
        ``routed``, else warm; its measured start time."""
        version = version or self._version(pool)
        started = self._clock()
        launcher = launcher_for_runtime(version.runtime, self._launchers)
        port = free_port()
        base_url = self._replica_url(launcher, port)
        spec = LaunchSpec(
            model=version.model.name, label=version.label, pool=pool.name, port=port,
            capacity=self._capacity, log_dir=self._log_dir, extra_args=self._engine_args,
            grace_s=self._grace_s,
        )  # fmt: skip
        log = self._log_dir / f"{pool.name}-{port}.log"
        self._log_dir.mkdir(parents=True, exist_ok=True)
        proc = spawn(
            launcher.argv(spec), log=log, cwd=SOURCE_ROOT, env=self._env,
            death_signal=self._death_signal,
        )  # fmt: skip
        timeout = self._start_timeout_s or launcher.start_timeout_s
        try:
            if launcher.registers_itself:
                endpoint = self._wait_registered(pool, base_url, proc, log, timeout)
            else:
                wait_http(f"{base_url}/health", timeout_s=timeout, exited=proc.poll)
                endpoint = endpoint_register(
                    actor=None, pool=pool, version=version, base_url=base_url,
                    capacity=self._capacity or launcher.default_capacity,
                )  # fmt: skip
        except (StartError, ActuatorError) as exc:
            self._kill(proc.pid, proc)
            # A worker that registered and then failed leaves no live endpoint behind.
            for left in Endpoint.objects.filter(pool=pool, base_url=base_url, state__in=LIVE):
                endpoint_set_state(actor=None, endpoint=left, state=Endpoint.State.GONE)
            raise ActuatorError(f"pool {pool.name}: replica did not start: {exc}") from exc
        self._children[proc.pid] = proc
        self._record(pool, endpoint, Record(proc.pid, port, warm=not routed))
        state = self._state_after_start(launcher, routed=routed)
        if state is not None:
            endpoint_set_state(actor=None, endpoint=endpoint, state=state)
        return endpoint, StartTime(version.id, self._clock() - started, warm=False)

    @staticmethod
    def _state_after_start(launcher: Launcher, *, routed: bool) -> str | None:
        if launcher.registers_itself:  # it is ready: a warm one is taken out of routing
            return None if routed else Endpoint.State.DRAINING
        return Endpoint.State.READY if routed else None  # it is starting: routed means ready

    def _wait_registered(
        self, pool: Pool, base_url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float
    ) -> Endpoint:
        """The endpoint a self-registering worker registered at ``base_url``, once ready."""
        deadline = self._clock() + timeout
        while self._clock() < deadline:
            code = proc.poll()
            if code is not None:
                raise ActuatorError(f"the worker exited with code {code}: {log_tail(log, 8)}")
            found = Endpoint.objects.filter(pool=pool, base_url=base_url).order_by("-id").first()
            if found is not None and found.state == Endpoint.State.READY:
                return found
            time.sleep(POLL_S)
        raise ActuatorError(f"the worker was not ready within {timeout:.0f} s (log {log})")

    def promote(self, endpoint: Endpoint) -> StartTime:
        started = self._clock()
        endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.READY)
        key = scaling_local_key(self._namespace, endpoint.pool.name)
        raw = self._redis.hget(key, str(endpoint.pk))
        if raw is not None:
            old = Record.decode(raw)
            self._redis.hset(key, str(endpoint.pk), Record(old.pid, old.port).encode())
        return StartTime(endpoint.version_id, self._clock() - started, warm=True)

    def drain(self, pool: Pool, endpoint: Endpoint) -> None:
        """Unroute ``endpoint``, wait for its engine to finish what it holds, stop it."""
        if endpoint.state in LIVE:
            endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.DRAINING)
        deadline = self._clock() + self._drain_timeout_s
        while self._clock() < deadline:
            load = self._load(endpoint)
            if load == 0 or load == float("inf"):  # drained, or the engine is gone already
                break
            time.sleep(0.05)
        self._stop_processes(pool, [endpoint])

    def _kill(self, pid: int, child: subprocess.Popen[bytes] | None) -> None:
        signal_group(pid, signal.SIGKILL)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(5.0)

    def _stop_processes(self, pool: Pool, endpoints: Sequence[Endpoint]) -> None:
        """SIGTERM the replicas of ``endpoints`` at once, wait (grace + 30 s), SIGKILL what is
        left of their groups; endpoints -> gone, records dropped."""
        records = self.records(pool)
        mine = [(e, records[e.pk]) for e in endpoints if e.pk in records]
        signalled: set[int] = set()
        for _endpoint, record in mine:
            if record.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, signal.SIGTERM)
                    signalled.add(record.pid)
        deadline = self._clock() + self._grace_s + 30.0
        for endpoint, record in mine:
            child = self._children.pop(record.pid, None)
            # Wait for the process itself to be gone, not for ``record.alive`` to turn false:
            # an exiting process loses its command line (so its ``--port``) before it dies.
            while record.pid in signalled and pid_alive(record.pid) and self._clock() < deadline:
                if child is not None:
                    child.poll()
                time.sleep(POLL_S)
            if child is not None or record.alive:  # never a group a reused pid leads
                self._kill(record.pid, child)
            self._redis.hdel(self._key(pool), str(endpoint.pk))
        for endpoint in endpoints:
            endpoint.refresh_from_db()
            if endpoint.state != Endpoint.State.GONE:
                endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.GONE)

    def apply(self, pool: Pool, plan: Plan) -> Actuation:
        done = Actuation()
        try:
            self._apply(pool, plan, done)
        except ActuatorError as exc:
            done.error = str(exc)
        return done

    def _apply(self, pool: Pool, plan: Plan, done: Actuation) -> None:
        records = self.reconcile(pool)
        ready = [e for e in self._live(pool) if e.state == Endpoint.State.READY]
        warm = self._warm(pool, records)
        if plan.action == "out":
            for endpoint in warm[: plan.promote]:
                done.starts.append(self.promote(endpoint))
                done.promoted += 1
            warm = warm[plan.promote :]
            for _ in range(plan.start):
                _, took = self.start(pool, routed=True)
                done.starts.append(took)
                done.started += 1
        elif plan.action in ("in", "zero"):
            # Only replicas this actuator started are stopped (a worker someone else runs is
            # left alone).
            ours = [e for e in ready if e.pk in records]
            victims = sorted(ours, key=self._load)
            victims = victims[: max(len(ready) - plan.desired, 0)]
            if plan.action == "zero":
                victims += warm
                warm = []
            for endpoint in victims:
                self.drain(pool, endpoint)
                done.stopped += 1
        for endpoint in warm[plan.warm :]:  # too many warm
            self.drain(pool, endpoint)
            done.stopped += 1
        for _ in range(plan.warm - len(warm)):  # too few warm
            self.start(pool, routed=False)

    def stop_all(self, pool: Pool) -> int:
        """Stop every replica this actuator started for ``pool`` (shutdown, tests); how many."""
        records = self.records(pool)
        endpoints = list(Endpoint.objects.filter(pool=pool, id__in=list(records)))
        known = {e.pk for e in endpoints}
        for endpoint_id, record in records.items():  # a record whose endpoint was deleted
            if endpoint_id not in known:
                child = self._children.pop(record.pid, None)
                if child is not None or record.alive:
                    self._kill(record.pid, child)
                self._redis.hdel(self._key(pool), str(endpoint_id))
        self._stop_processes(pool, endpoints)
        return len(records)

    def close(self) -> None:
        self._redis.close()
