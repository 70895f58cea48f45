"""``switchyard`` and ``switchyard-fcfs``: the real router, configured without Django.

The snapshot is built here from the scenario with the ``runtime.snapshot`` structures
(tenants with generated API keys, whose sha256 digests go in the snapshot; the scenario's
classes; one simulator model and version; one pool whose ``policies`` choose the scheduling;
the backends as ready endpoints) and published to Redis under a prefix unique to the run and
target. Then ``python -m runtime.gateway`` starts with one worker, pinned to the router core.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis

from bench.procs import free_port, pinned, spawn, wait_http
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
from runtime.snapshot import (
    ApiKeySnap,
    EndpointSnap,
    ModelSnap,
    PoolSnap,
    RequestClassSnap,
    Snapshot,
    TenantLimits,
    TenantSnap,
    VersionSnap,
)
from runtime.snapshot_store import publish

VERSION_ID = 1
POOL = "bench-pool"
BIG = 1_000_000_000


def key_prefix(key: str) -> str:
    """The 8-character prefix of a key in the production format ``sy_<prefix>_<secret>``."""
    return key.split("_")[1]


def build_snapshot(
    scenario: Scenario,
    backend_urls: list[str],
    keys: Mapping[str, str],
    policies: Mapping[str, str],
) -> Snapshot:
    """The router's whole configuration for this scenario, as the control plane would."""
    classes = tuple(scenario.classes)
    model = scenario.backends.model
    limits = TenantLimits(
        rpm=BIG, tpm=BIG, max_concurrency=BIG,
        max_context_tokens=BIG, max_output_tokens=scenario.backends.max_model_len,
    )  # fmt: skip
    tenants = {
        t.name: TenantSnap(
            slug=t.name,
            name=t.name,
            status="active",
            weight=t.weight,
            limits=limits,
            classes=classes,
            default_class=classes[0],
        )
        for t in scenario.tenants
    }
    api_keys = {
        key_prefix(key): ApiKeySnap(
            prefix=key_prefix(key),
            digest=hashlib.sha256(key.encode()).hexdigest(),
            tenant=tenant,
            name=f"bench-{tenant}",
            scopes=("inference",),
            expires_at=None,
        )
        for tenant, key in keys.items()
    }
    request_classes = {
        c.name: RequestClassSnap(
            name=c.name,
            priority_band=c.priority_band,
            ttft_slo_ms=int(c.ttft_slo_ms),
            deadline_ms=c.deadline_ms,
            max_queue_length=c.max_queue_length,
            shed_order=c.shed_order,
        )
        for c in scenario.classes.values()
    }
    version = VersionSnap(
        id=VERSION_ID, model=model, label="v1", artifact_uri="", digest="0" * 64,
        runtime="simulator" if scenario.backends.kind == "simulator" else "vllm",
        max_context=0, tokenizer="", default_sampling={}, memory_gb=1.0,
        tensor_parallel_size=1,
    )  # fmt: skip
    endpoints = {
        i + 1: EndpointSnap(
            id=i + 1,
            pool=POOL,
            version=VERSION_ID,
            base_url=url,
            state="ready",
            capacity=scenario.backends.max_num_seqs,
        )
        for i, url in enumerate(backend_urls)
    }
    return Snapshot(
        version=0,
        created_at=time.time(),
        tenants=tenants,
        api_keys=api_keys,
        classes=request_classes,
        models={model: ModelSnap(name=model, task="chat", versions=(VERSION_ID,))},
        versions={VERSION_ID: version},
        pools={
            POOL: PoolSnap(
                name=POOL,
                hardware_tier="bench",
                cost_per_replica_hour=0.0,
                min_replicas=0,
                max_replicas=len(endpoints),
                warm_replicas=0,
                policies=dict(policies),
            )
        },
        endpoints=endpoints,
    )


@dataclass
class SwitchyardTarget(Target):
    fairness: str | None = None  # overrides the scenario's pool policy "fairness"
    _prefix: str = ""
    _redis_url: str = ""
    _env_keys: list[str] = field(default_factory=list)

    def policies(self, scenario: Scenario) -> dict[str, str]:
        policies = dict(scenario.switchyard.policies)
        if self.fairness is not None:
            policies["fairness"] = self.fairness
        return policies

    async def start(self, ctx: TargetContext) -> None:
        try:
            import runtime.gateway.app  # noqa: F401, PLC0415 - is the router there at all?
        except ImportError as exc:
            raise TargetUnavailableError(f"the router cannot be imported: {exc}") from None
        self._prefix = f"bench:{ctx.run_id}:{self.name}"
        self._redis_url = ctx.redis_url
        policies = self.policies(ctx.scenario)
        snapshot = build_snapshot(ctx.scenario, list(ctx.backend_urls), ctx.keys, policies)
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
            }
        )
        argv = python_argv(
            "runtime.gateway", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--log-level", ctx.scenario.switchyard.log_level, "--graceful-shutdown-s", "2",
        )  # fmt: skip
        child = spawn(self.name, pinned(argv, ctx.router_cpus), port=port,
                      log_dir=ctx.work_dir, env=env, cwd=REPO_ROOT)  # fmt: skip
        self.children.append(child)
        await wait_http(child, ctx.session, "/readyz", timeout_s=ctx.start_timeout_s)
        first = next(iter(ctx.keys.values()))
        await warm_up(ctx.session, child.base_url, model=ctx.scenario.backends.model,
                      headers={"Authorization": f"Bearer {first}"}, count=3,
                      timeout_s=ctx.start_timeout_s, child=child)  # fmt: skip
        self.base_urls = [child.base_url]
        self.info = {
            "kind": "switchyard router (python -m runtime.gateway, 1 worker)",
            "policies": policies,
            "snapshot_prefix": f"{self._prefix}:snapshot",
            "cpus": list(ctx.router_cpus),
        }

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
        if self._prefix:
            with contextlib.suppress(redis.RedisError):
                await asyncio.to_thread(self._cleanup)
