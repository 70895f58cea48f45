"""The local actuator: replicas are simulator (or worker) processes on this machine.

A replica is started in its own process group (:func:`runtime.procs.spawn`), waited for on
``/health``, and registered through the registry services: ``starting`` (a *warm* replica:
loaded, not routed) or ``ready`` (routed). Its process id is kept in Redis
(``{ns}:scaling:local:{pool}``), so whichever Celery process runs the next tick can stop it.

Scale-in drains the least loaded routed replica it started (by its engine's running + waiting
requests; a replica someone else runs is never stopped): endpoint -> ``draining`` (routers stop
sending to it on the next snapshot), wait until the engine has nothing in flight, stop the
process, endpoint -> ``gone``. Nothing in flight is cut.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from apps.models.models import Endpoint, ModelVersion, Pool
from apps.models.services.fleet import endpoint_register, endpoint_set_state
from apps.scaling.actuators.base import Actuation, ActuatorError, Replicas, StartTime
from runtime.contract import scaling_local_key
from runtime.procs import StartError, free_port, pid_alive, spawn, stop_pid, wait_http
from runtime.scaling.controller import Plan

REPO_ROOT = Path(__file__).resolve().parents[3]
LIVE = (Endpoint.State.STARTING, Endpoint.State.READY)


def engine_load(base_url: str, *, timeout: float = 2.0) -> float:
    """Running + waiting requests from a vLLM-compatible ``/metrics`` (inf when unreachable)."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as resp:  # noqa: S310
            text = resp.read().decode()
    except OSError:
        return float("inf")
    total = 0.0
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            total += float(line.rpartition(" ")[2])
    return total


class LocalActuator:
    name = "local"

    def __init__(
        self,
        *,
        redis_url: str,
        namespace: str,
        log_dir: Path,
        capacity: int = 8,
        engine_args: Sequence[str] = (),
        start_timeout_s: float = 60.0,
        drain_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis.Redis.from_url(redis_url)
        self._namespace = namespace
        self._log_dir = log_dir
        self._capacity = capacity
        self._engine_args = tuple(engine_args)
        self._start_timeout_s = start_timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._clock = clock
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # ours: reaped on stop

    # -- what runs ----------------------------------------------------------------------

    def _pids(self, pool: Pool) -> dict[int, int]:
        raw = self._redis.hgetall(scaling_local_key(self._namespace, pool.name))
        return {int(k): int(v) for k, v in raw.items()}

    def _live(self, pool: Pool) -> list[Endpoint]:
        return list(Endpoint.objects.filter(pool=pool, state__in=LIVE).order_by("id"))

    def observe(self, pool: Pool) -> Replicas:
        pids = self._pids(pool)
        live = self._live(pool)
        serving = sum(1 for e in live if e.state == Endpoint.State.READY)
        warm = sum(
            1 for e in live if e.state == Endpoint.State.STARTING and pid_alive(pids.get(e.id, -1))
        )
        return Replicas(serving=serving, warm=warm)

    def _version(self, pool: Pool) -> ModelVersion:
        last = Endpoint.objects.filter(pool=pool).select_related("version__model").last()
        if last is None:
            raise ActuatorError(f"pool {pool.name}: no endpoint ever registered; no version to run")
        return last.version

    # -- actions ------------------------------------------------------------------------

    def start(
        self, pool: Pool, *, routed: bool, version: ModelVersion | None = None
    ) -> tuple[Endpoint, StartTime]:
        """Start one replica of ``version`` (default: the pool's current one), ready when
        ``routed``, else warm; its measured start time."""
        version = version or self._version(pool)
        started = self._clock()
        port = free_port()
        argv = [
            sys.executable, "-m", "runtime.workers.simulator", "--model", version.model.name,
            "--port", str(port), "--max-num-seqs", str(self._capacity), "--log-level", "WARNING",
            *self._engine_args,
        ]  # fmt: skip
        log = self._log_dir / f"{pool.name}-{port}.log"
        proc = spawn(argv, log=log, cwd=REPO_ROOT, death_signal=None)
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{base_url}/health", timeout_s=self._start_timeout_s, exited=proc.poll)
        except StartError as exc:
            stop_pid(proc.pid, signal.SIGKILL, timeout=1.0, wait=proc.wait)
            raise ActuatorError(f"pool {pool.name}: replica did not start: {exc}") from exc
        self._children[proc.pid] = proc
        endpoint = endpoint_register(
            actor=None, pool=pool, version=version, base_url=base_url, capacity=self._capacity
        )
        self._redis.hset(scaling_local_key(self._namespace, pool.name), str(endpoint.id), proc.pid)
        if routed:
            endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.READY)
        return endpoint, StartTime(version.id, self._clock() - started, warm=False)

    def promote(self, endpoint: Endpoint) -> StartTime:
        started = self._clock()
        endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.READY)
        return StartTime(endpoint.version_id, self._clock() - started, warm=True)

    def drain(self, pool: Pool, endpoint: Endpoint) -> None:
        """Unroute ``endpoint``, wait for its engine to finish what it holds, stop it."""
        if endpoint.state == Endpoint.State.READY:
            endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.DRAINING)
        deadline = self._clock() + self._drain_timeout_s
        while self._clock() < deadline:
            load = engine_load(endpoint.base_url)
            if load == 0 or load == float("inf"):  # drained, or the engine is gone already
                break
            time.sleep(0.05)
        self._stop_process(pool, endpoint)
        endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.GONE)

    def _stop_process(self, pool: Pool, endpoint: Endpoint) -> None:
        key = scaling_local_key(self._namespace, pool.name)
        raw = self._redis.hget(key, str(endpoint.id))
        if raw is not None:
            pid = int(raw)
            child = self._children.pop(pid, None)
            stop_pid(pid, signal.SIGTERM, timeout=10.0, wait=child.wait if child else None)
            self._redis.hdel(key, str(endpoint.id))

    def apply(self, pool: Pool, plan: Plan) -> Actuation:
        done = Actuation()
        try:
            self._apply(pool, plan, done)
        except ActuatorError as exc:
            done.error = str(exc)
        return done

    def _apply(self, pool: Pool, plan: Plan, done: Actuation) -> None:
        pids = self._pids(pool)
        live = self._live(pool)
        ready = [e for e in live if e.state == Endpoint.State.READY]
        warm = [
            e for e in live if e.state == Endpoint.State.STARTING and pid_alive(pids.get(e.id, -1))
        ]
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
            # Only replicas this actuator started are stopped (a worker someone else runs, such
            # as a fixed `up` worker, is left alone).
            ours = [e for e in ready if e.id in pids]
            victims = sorted(ours, key=lambda e: engine_load(e.base_url))
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

    def stop_all(self, pool: Pool) -> None:
        """Stop every replica this actuator started for ``pool`` (tests, shutdown)."""
        for endpoint in Endpoint.objects.filter(pool=pool, id__in=list(self._pids(pool))):
            self._stop_process(pool, endpoint)
            if endpoint.state != Endpoint.State.GONE:
                endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.GONE)
