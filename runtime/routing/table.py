"""Per-snapshot routing indexes: the endpoints of each version, and a selector per pool.

A LoRA adapter version is served by its base version's endpoints.

Rebuilt lazily when the snapshot object changes (snapshots are immutable, so identity is
enough). Selectors are cached by their policy set across snapshots, so round-robin turns
survive a publish. A pool whose policies name an unknown filter, scorer or picker routes
with the defaults and is logged as an error once per policy set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from runtime.policy_names import UnknownPolicyError
from runtime.routing.endpoints import EndpointSelector, EndpointSignals
from runtime.snapshot import EndpointSnap, Snapshot

logger = logging.getLogger(__name__)

PolicyKey = tuple[tuple[str, str], ...]


class RoutingTable:
    __slots__ = ("_by_version", "_pool_of_version", "_selectors", "_snapshot")

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._by_version: dict[int, tuple[EndpointSnap, ...]] = {}
        self._pool_of_version: dict[int, str] = {}
        self._selectors: dict[PolicyKey, EndpointSelector] = {}

    def _refresh(self, snapshot: Snapshot) -> None:
        if snapshot is self._snapshot:
            return
        by_version: dict[int, list[EndpointSnap]] = {}
        for endpoint in sorted(snapshot.endpoints.values(), key=lambda e: e.id):
            by_version.setdefault(endpoint.version, []).append(endpoint)
        # A LoRA adapter has no endpoints of its own: its base version's replicas load it.
        for version in snapshot.versions.values():
            if version.base_version is not None and version.base_version in by_version:
                by_version[version.id] = by_version[version.base_version]
        self._by_version = {v: tuple(eps) for v, eps in by_version.items()}
        # A version served from several pools uses the policies of the first pool by name.
        self._pool_of_version = {v: min(e.pool for e in eps) for v, eps in by_version.items()}
        self._snapshot = snapshot

    def endpoints(self, snapshot: Snapshot, version_id: int) -> tuple[EndpointSnap, ...]:
        self._refresh(snapshot)
        return self._by_version.get(version_id, ())

    def pool_of(self, snapshot: Snapshot, version_id: int) -> str | None:
        """The pool whose policies (and queue) serve ``version_id``; None without endpoints."""
        self._refresh(snapshot)
        return self._pool_of_version.get(version_id)

    def policies(self, snapshot: Snapshot, version_id: int) -> Mapping[str, str]:
        self._refresh(snapshot)
        pool = snapshot.pools.get(self._pool_of_version.get(version_id, ""))
        return pool.policies if pool is not None else {}

    def selector(self, snapshot: Snapshot, version_id: int) -> EndpointSelector:
        policies = self.policies(snapshot, version_id)
        key: PolicyKey = tuple(sorted(policies.items()))
        selector = self._selectors.get(key)
        if selector is None:
            try:
                selector = EndpointSelector.from_policies(policies)
            except UnknownPolicyError as exc:
                # The control plane refuses such names (runtime.pool_policies); an old or
                # hand-made snapshot may still carry one. Never take the pool down for it.
                logger.error(  # noqa: TRY400 - the message is the point, not the stack
                    "routing: pool %s has invalid policies %r (%s); it routes with the "
                    "DEFAULT filters, scorers and picker until a snapshot fixes them",
                    self._pool_of_version.get(version_id, "?"),
                    policies,
                    exc,
                )
                selector = EndpointSelector.from_policies({})
            self._selectors[key] = selector
        return selector

    def pick(
        self,
        snapshot: Snapshot,
        version_id: int,
        signals: EndpointSignals,
        exclude: frozenset[int] | set[int] = frozenset(),
    ) -> EndpointSnap | None:
        """The endpoint for the next attempt, or None when none is eligible."""
        endpoints = self.endpoints(snapshot, version_id)
        if not endpoints:
            return None
        return self.selector(snapshot, version_id).select(endpoints, signals, exclude)
