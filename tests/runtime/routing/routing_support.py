"""Small snapshot builders for the routing tests."""

from __future__ import annotations

from runtime.routing.adapters import AdapterSignal
from runtime.snapshot import EndpointSnap, PoolSnap, Snapshot, VersionSnap
from runtime.testing.snapshots import SnapshotBuilder, endpoint_snap, pool_snap, version_snap


def version(version_id: int, model: str = "m") -> VersionSnap:
    return version_snap(version_id, model)


def endpoint(
    endpoint_id: int, version_id: int = 1, *, state: str = "ready", capacity: int = 4,
    pool: str = "p",
) -> EndpointSnap:  # fmt: skip
    return endpoint_snap(endpoint_id, version_id, state=state, capacity=capacity, pool=pool)


def pool(name: str = "p", **policies: str) -> PoolSnap:
    return pool_snap(name, max_replicas=1, policies=dict(policies))


def snapshot(
    *,
    versions: tuple[int, ...] = (1,),
    splits: tuple[tuple[int, int], ...] | None = None,
    sticky_key: str = "tenant",
    endpoints: tuple[EndpointSnap, ...] = (),
    pools: tuple[PoolSnap, ...] = (),
) -> Snapshot:
    world = SnapshotBuilder()
    world.add_model("m", versions[0])
    for v in versions[1:]:
        world.add_version("m", v)
    if splits is not None:
        world.add_route("m", splits, sticky_key=sticky_key)
    world.endpoints.update({e.id: e for e in endpoints})
    world.pools.update({p.name: p for p in pools} or {"p": pool()})
    return world.snapshot(version=1, created_at=0.0)


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
        cached: dict[int, float] | None = None,
        adapters: dict[int, AdapterSignal] | None = None,
    ) -> None:
        self.open_breakers = open_breakers or set()
        self.unhealthy = unhealthy or set()
        self.counts = inflight or {}
        self.kv = kv or {}
        self.costs = costs or {}
        self.key = key
        self.cached = cached
        self.adapters = adapters

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

    def cached_prefix(self, endpoint_id: int) -> float | None:
        return None if self.cached is None else self.cached.get(endpoint_id, 0.0)

    def adapter(self, endpoint_id: int) -> AdapterSignal | None:
        return None if self.adapters is None else self.adapters.get(endpoint_id)
