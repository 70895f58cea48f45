"""What a router adds to its live document besides the requests (read once a second).

Plain dicts built from the snapshot in force and the router's own counters: the pools' queue
depth per band, tenant shares and Jain's index; each endpoint's state, health, KV use and
in-flight requests against its capacity and its resident LoRA adapters (the router's
residency book: its own loads and the replica's heartbeat); the request classes' TTFT SLOs;
the routes this router follows (model -> version label -> weight) and its snapshot's version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.telemetry.live import LiveSources

if TYPE_CHECKING:
    from runtime.gateway.state import RouterState


def live_sources(state: RouterState) -> LiveSources:
    def pool_of(endpoint: str) -> str:
        snapshot = state.snapshot
        found = None if snapshot is None else snapshot.endpoints.get(int(endpoint))
        return "" if found is None else found.pool

    return LiveSources(
        pool_of=pool_of,
        pools=lambda: _pools(state),
        endpoints=lambda: _endpoints(state),
        classes=lambda: _classes(state),
        routes=lambda: _routes(state),
        snapshot_version=lambda: None if state.snapshot is None else state.snapshot.version,
    )


def _pools(state: RouterState) -> list[dict[str, Any]]:
    return [
        {
            "pool": view.pool,
            "queued": {str(band): n for band, n in view.queued.items()},
            "served_share": dict(view.served_share),
            "entitled_share": dict(view.entitled_share),
            "jain": view.jain,
        }
        for view in state.pool_views()
    ]


def _endpoints(state: RouterState) -> list[dict[str, Any]]:
    snapshot = state.snapshot
    if snapshot is None:
        return []
    rows: list[dict[str, Any]] = []
    resident = state.upstream.adapters.resident()
    for endpoint in snapshot.endpoints.values():
        version = snapshot.versions.get(endpoint.version)
        status = state.health.status(endpoint.id)
        rows.append(
            {
                "id": endpoint.id,
                "pool": endpoint.pool,
                "model": "" if version is None else version.model,
                "version": "" if version is None else version.label,
                "state": endpoint.state,
                "healthy": status is not None and status.healthy,
                # healthy on real traffic's successes alone: its probes time out (overload)
                "passive": status is not None and status.passive,
                "kv_usage": None if status is None else status.kv_usage,
                "inflight": state.inflight.get(endpoint.id),
                "capacity": endpoint.capacity,
                "adapters": list(resident.get(endpoint.id, ())),
            }
        )
    return rows


def _classes(state: RouterState) -> dict[str, dict[str, Any]]:
    snapshot = state.snapshot
    if snapshot is None:
        return {}
    return {
        name: {"band": klass.priority_band, "ttft_slo_ms": klass.ttft_slo_ms}
        for name, klass in snapshot.classes.items()
    }


def _routes(state: RouterState) -> dict[str, dict[str, int]]:
    snapshot = state.snapshot
    if snapshot is None:
        return {}
    routes: dict[str, dict[str, int]] = {}
    for model, route in snapshot.routes.items():
        weights = routes[model] = {}
        for split in route.splits:
            version = snapshot.versions.get(split.version)
            label = str(split.version) if version is None else version.label
            weights[label] = weights.get(label, 0) + split.weight
    return routes
