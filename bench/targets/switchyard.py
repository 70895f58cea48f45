"""``switchyard`` and ``switchyard-fcfs``: the real router, configured without Django.

The snapshot is built here from the scenario with the shared builder
(:mod:`runtime.testing.snapshots`: tenants with generated API keys, whose digests go in the
snapshot; the scenario's classes; one model and version; one pool whose ``policies`` choose
the scheduling; the backends as ready endpoints) and published to Redis under a prefix unique
to the run and target. Then ``python -m runtime.gateway`` starts with one worker, pinned to the
router core.

``tls``: the router serves HTTPS with the run's local CA (``switchyard-tls``; the load
generator's session trusts it). ``mtls`` as well: the target starts backends of its own that
require client certificates (the simulator with vLLM's ``--ssl-cert-reqs 2``, on the backends'
cores, not counted as the router's) and the router presents its certificate to them
(``switchyard-mtls``): what ``switchyard up --tls`` runs. ``http``: the router's HTTP entry
(``SWITCHYARD_ROUTER_HTTP``): ``switchyard-asgi`` and ``switchyard-channels`` are the A/B of
issue #27's framework question. ``stages``: the router's inference stage list cut to these
(:mod:`bench.chassis_router`, one worker): ``switchyard-chassis``, issue #27's chassis.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis

from bench.procs import Child, StartError, extra_router_cpus, free_port, pinned, spawn, wait_http
from bench.scenario import Scenario
from bench.targets.base import (
    REPO_ROOT,
    Target,
    TargetContext,
    TargetUnavailableError,
    python_argv,
    python_env,
    warm_up,
)
from runtime import tls
from runtime.snapshot import Snapshot
from runtime.snapshot_store import publish
from runtime.testing.snapshots import SnapshotBuilder, limits

VERSION_ID = 1
POOL = "bench-pool"
BIG = 1_000_000_000


def build_snapshot(
    scenario: Scenario,
    backend_urls: list[str],
    keys: Mapping[str, str],
    policies: Mapping[str, str],
    kv_events: Sequence[str] = (),
) -> Snapshot:
    """The router's whole configuration for this scenario, as the control plane would."""
    world = SnapshotBuilder()
    for c in scenario.classes.values():
        world.add_class(
            c.name, band=c.priority_band, deadline_ms=c.deadline_ms,
            ttft_slo_ms=int(c.ttft_slo_ms), max_queue_length=c.max_queue_length,
            shed_order=c.shed_order,
        )  # fmt: skip
    classes = tuple(scenario.classes)
    tenant_limits = limits(
        rpm=BIG, tpm=BIG, max_concurrency=BIG, max_context=BIG,
        max_output=scenario.backends.max_model_len,
    )  # fmt: skip
    for t in scenario.tenants:
        world.add_tenant(
            t.name, name=t.name, weight=t.weight, tenant_limits=tenant_limits, classes=classes,
            default_class=classes[0],
        )  # fmt: skip
    for tenant, key in keys.items():
        world.add_key(f"bench-{tenant}", tenant, full_key=key)
    model = scenario.backends.model
    runtime = "simulator" if scenario.backends.kind == "simulator" else "vllm"
    world.add_model(model, VERSION_ID, runtime=runtime)
    world.add_pool(
        POOL, hardware_tier="bench", max_replicas=len(backend_urls), policies=dict(policies)
    )
    for i, url in enumerate(backend_urls):
        world.add_endpoint(
            i + 1, VERSION_ID, url, pool=POOL, capacity=scenario.backends.max_num_seqs,
            kv_events=kv_events[i] if kv_events else "",
        )  # fmt: skip
    return world.snapshot()


def worker_cpus(router_cpus: tuple[int, ...], workers: int) -> tuple[int, ...]:
    """The routers' core, plus the ones just below it for extra workers. On four cores or
    more the run keeps the second one free of the load generator and backends
    (:func:`bench.runner.client_cpus`); on a 2-core machine a second worker shares a core
    with them."""
    if not router_cpus or workers <= 1:
        return router_cpus
    return (*router_cpus, *extra_router_cpus(router_cpus, workers - len(router_cpus)))


@dataclass
class SwitchyardTarget(Target):
    fairness: str | None = None  # overrides the scenario's pool policy "fairness"
    workers: int = 1  # router processes (--workers); each gets a core of its own if it can
    scorers: str | None = None  # overrides the scenario's pool policy "scorers"
    prefix_routing: str | None = None  # overrides the pool policy "prefix_routing" (on|off)
    extra_policies: tuple[tuple[str, str], ...] = ()  # more pool policies, e.g. preemption
    kv_events: bool = False  # subscribe to the backends' KV events (precise prefix scoring)
    tls: bool = False  # serve HTTPS (the run's CA)
    mtls: bool = False  # and call backends of its own over mTLS
    http: str | None = None  # SWITCHYARD_ROUTER_HTTP (asgi | channels); None: the default
    source: Path | None = None  # run the router from this checkout (a baseline), not ours
    profile: Path | None = None  # run the router under cProfile, its stats written here at stop
    runner: str = "bench.profiled_router"  # the wrapper module that writes ``profile``
    stages: tuple[str, ...] = ()  # keep only these inference stages (bench.chassis_router)
    _backends: list[Child] = field(default_factory=list)
    _prefix: str = ""
    _redis_url: str = ""
    _env_keys: list[str] = field(default_factory=list)

    def policies(self, scenario: Scenario) -> dict[str, str]:
        policies = dict(scenario.switchyard.policies)
        if self.fairness is not None:
            policies["fairness"] = self.fairness
        if self.scorers is not None:
            policies["scorers"] = self.scorers
        if self.prefix_routing is not None:
            policies["prefix_routing"] = self.prefix_routing
        policies.update(self.extra_policies)
        return policies

    async def start(self, ctx: TargetContext) -> None:
        try:
            import runtime.gateway.app  # noqa: F401, PLC0415 - is the router there at all?
        except ImportError as exc:
            raise TargetUnavailableError(f"the router cannot be imported: {exc}") from None
        if self.stages and self.workers > 1:  # uvicorn's worker processes would not be cut
            raise TargetUnavailableError("a cut stage list runs with one worker only")
        self._prefix = f"bench:{ctx.run_id}:{self.name}"
        self._redis_url = ctx.redis_url
        policies = self.policies(ctx.scenario)
        tls_env = self._tls_env(ctx)
        backend_urls = list(ctx.backend_urls)
        if self.mtls:
            backend_urls = await self._start_mtls_backends(ctx)
        events = ctx.backend_kv_events if self.kv_events and not self.mtls else ()
        snapshot = build_snapshot(ctx.scenario, backend_urls, ctx.keys, policies, events)
        try:
            await asyncio.to_thread(self._publish, snapshot)
        except redis.RedisError as exc:
            raise TargetUnavailableError(f"Redis at {ctx.redis_url} is not usable: {exc}") from None
        port = free_port()
        var_dir = ctx.work_dir / f"{self.name}-var"
        var_dir.mkdir(parents=True, exist_ok=True)
        env = python_env(
            {
                "REDIS_URL": ctx.redis_url,
                "SWITCHYARD_SNAPSHOT_PREFIX": f"{self._prefix}:snapshot",
                "SWITCHYARD_VAR_DIR": str(var_dir),
                # Every key the router writes lives under the target's prefix: the two
                # Switchyard targets share no counters, and stop() deletes them all.
                "SWITCHYARD_KEY_USAGE_HASH": f"{self._prefix}:apikey:last_used",
                "SWITCHYARD_LIMITS_PREFIX": f"{self._prefix}:limits",
                "SWITCHYARD_FAIRNESS_PREFIX": f"{self._prefix}:fairness",
                **ctx.scenario.switchyard.env,
                **tls_env,
                **({} if self.http is None else {"SWITCHYARD_ROUTER_HTTP": self.http}),
            }
        )
        if self.source is not None:  # its code first on the path, and `-m` from there
            env["PYTHONPATH"] = os.pathsep.join([str(self.source), env["PYTHONPATH"]])
        cpus = worker_cpus(ctx.router_cpus, self.workers)
        argv = python_argv(
            "runtime.gateway", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(self.workers),
            "--log-level", ctx.scenario.switchyard.log_level, "--graceful-shutdown-s", "2",
        )  # fmt: skip
        if self.profile is not None:  # the router under cProfile (or another bench wrapper)
            argv = [argv[0], "-m", self.runner, str(self.profile), *argv[3:]]
        elif self.stages:  # its stage list cut before it starts (one worker: the cut is ours)
            argv = [argv[0], "-m", "bench.chassis_router", ",".join(self.stages), *argv[3:]]
        child = spawn(self.name, pinned(argv, cpus), port=port,
                      log_dir=ctx.work_dir, env=env, cwd=self.source or REPO_ROOT)  # fmt: skip
        self.children.append(child)
        url = f"https://127.0.0.1:{port}" if self.tls else child.base_url
        if not self.tls:  # over HTTPS the warm-up below is the wait
            await wait_http(child, ctx.session, "/readyz", timeout_s=ctx.start_timeout_s)
        first = next(iter(ctx.keys.values()))
        await warm_up(ctx.session, url, model=ctx.scenario.backends.model,
                      headers={"Authorization": f"Bearer {first}"}, count=3,
                      timeout_s=ctx.start_timeout_s, child=child)  # fmt: skip
        self.base_urls = [url]
        tls_kind = ", HTTPS" if self.tls else ""
        tls_kind += " + mTLS to its own backends" if self.mtls else ""
        tls_kind += f", code from {self.source}" if self.source is not None else ""
        self.info = {
            "kind": f"switchyard router (python -m runtime.gateway, {self.workers} worker(s)"
            f"{tls_kind})",
            "policies": policies,
            "http": self.http or "default",
            "stages": list(self.stages) or "all",
            "snapshot_prefix": f"{self._prefix}:snapshot",
            "workers": self.workers,
            "cpus": list(cpus),
        }

    def _tls_env(self, ctx: TargetContext) -> dict[str, str]:
        if not self.tls:
            return {}
        if ctx.pki is None:
            raise TargetUnavailableError("the run made no local CA for an HTTPS target")
        pki = ctx.pki
        env = {tls.ENV_CERT: str(pki.cert), tls.ENV_KEY: str(pki.key)}
        if self.mtls:
            env |= {tls.ENV_UPSTREAM_CA: str(pki.ca), tls.ENV_UPSTREAM_CERT: str(pki.cert),
                    tls.ENV_UPSTREAM_KEY: str(pki.key)}  # fmt: skip
        return env

    async def _start_mtls_backends(self, ctx: TargetContext) -> list[str]:
        """The scenario's backends again, requiring client certificates; their URLs."""
        from bench.backends import backend_argv  # noqa: PLC0415 - bench.backends imports us

        pki = ctx.pki
        assert pki is not None  # _tls_env checked
        flags = ["--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key),
                 "--ssl-ca-certs", str(pki.ca), "--ssl-cert-reqs", "2"]  # fmt: skip
        for i in range(ctx.scenario.backends.count):
            port = free_port()
            argv = pinned([*backend_argv(ctx.scenario.backends, port, i), *flags],
                          ctx.backend_cpus)  # fmt: skip
            self._backends.append(
                spawn(f"{self.name}-backend-{i}", argv, port=port, log_dir=ctx.work_dir,
                      env=python_env(), cwd=REPO_ROOT)
            )  # fmt: skip
        client = tls.ClientTLS(ca=pki.ca, cert=pki.cert, key=pki.key).context()
        urls = [f"https://127.0.0.1:{b.port}" for b in self._backends]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client)) as http:
            await asyncio.gather(*(
                _wait_health(http, b, url, ctx.start_timeout_s)
                for b, url in zip(self._backends, urls, strict=True)
            ))  # fmt: skip
        return urls

    def _publish(self, snapshot: Snapshot) -> None:
        client: redis.Redis[bytes] = redis.Redis.from_url(self._redis_url)
        try:
            publish(client, snapshot, prefix=f"{self._prefix}:snapshot")
        finally:
            client.close()

    def _cleanup(self) -> None:
        client: redis.Redis[bytes] = redis.Redis.from_url(self._redis_url)
        try:
            keys = list(client.scan_iter(match=f"{self._prefix}:*", count=500))
            if keys:
                client.delete(*keys)
        finally:
            client.close()

    async def stop(self) -> None:
        await super().stop()
        for backend in self._backends:
            await asyncio.to_thread(backend.stop)
        if self._prefix:
            with contextlib.suppress(redis.RedisError):
                await asyncio.to_thread(self._cleanup)


async def _wait_health(
    http: aiohttp.ClientSession, child: Child, url: str, timeout_s: float
) -> None:
    """Poll ``url``/health (over mTLS) until 200; StartError on exit or timeout."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if not child.alive():
            raise StartError(f"{child.name} exited:\n{child.tail()}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise StartError(f"{child.name}: {url}/health did not answer in {timeout_s:.0f} s")
