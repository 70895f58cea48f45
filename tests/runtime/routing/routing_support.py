"""Small snapshot builders for the routing tests."""

from __future__ import annotations

from runtime.snapshot import (
    EndpointSnap,
    ModelSnap,
    PoolSnap,
    RouteSnap,
    RouteSplit,
    Snapshot,
    VersionSnap,
)


def version(version_id: int, model: str = "m") -> VersionSnap:
    return VersionSnap(
        id=version_id, model=model, label=f"v{version_id}", artifact_uri="", digest="0" * 64,
        runtime="simulator", max_context=0, tokenizer="", default_sampling={}, memory_gb=1.0,
        tensor_parallel_size=1,
    )  # fmt: skip


def endpoint(
    endpoint_id: int, version_id: int = 1, *, state: str = "ready", capacity: int = 4,
    pool: str = "p",
) -> EndpointSnap:  # fmt: skip
    return EndpointSnap(
        id=endpoint_id, pool=pool, version=version_id, base_url=f"http://h{endpoint_id}",
        state=state, capacity=capacity,
    )  # fmt: skip


def pool(name: str = "p", **policies: str) -> PoolSnap:
    return PoolSnap(
        name=name, hardware_tier="cpu", cost_per_replica_hour=0.0, min_replicas=0,
        max_replicas=1, warm_replicas=0, policies=dict(policies),
    )  # fmt: skip


def snapshot(
    *,
    versions: tuple[int, ...] = (1,),
    splits: tuple[tuple[int, int], ...] | None = None,
    sticky_key: str = "tenant",
    endpoints: tuple[EndpointSnap, ...] = (),
    pools: tuple[PoolSnap, ...] = (),
) -> Snapshot:
    routes = {}
    if splits is not None:
        routes["m"] = RouteSnap(
            model="m",
            splits=tuple(RouteSplit(version=v, weight=w) for v, w in splits),
            sticky_key=sticky_key,
        )
    return Snapshot(
        version=1,
        created_at=0.0,
        models={"m": ModelSnap(name="m", task="chat", versions=versions)},
        versions={v: version(v) for v in versions},
        routes=routes,
        endpoints={e.id: e for e in endpoints},
        pools={p.name: p for p in pools} or {"p": pool()},
    )


class Signals:
    """Plain signals for unit tests (the real ones come from runtime.routing.signals)."""

    def __init__(
        self,
        *,
        open_breakers: set[int] | None = None,
        unhealthy: set[int] | None = None,
        inflight: dict[int, int] | None = None,
        kv: dict[int, float] | None = None,
        costs: dict[str, float] | None = None,
        key: str | None = None,
    ) -> None:
        self.open_breakers = open_breakers or set()
        self.unhealthy = unhealthy or set()
        self.counts = inflight or {}
        self.kv = kv or {}
        self.costs = costs or {}
        self.key = key

    def breaker_available(self, endpoint_id: int) -> bool:
        return endpoint_id not in self.open_breakers

    def healthy(self, endpoint_id: int) -> bool:
        return endpoint_id not in self.unhealthy

    def inflight(self, endpoint_id: int) -> int:
        return self.counts.get(endpoint_id, 0)

    def kv_usage(self, endpoint_id: int) -> float | None:
        return self.kv.get(endpoint_id)

    def cost_per_hour(self, endpoint: EndpointSnap) -> float | None:
        return self.costs.get(endpoint.pool)

    def affinity_key(self) -> str | None:
        return self.key
