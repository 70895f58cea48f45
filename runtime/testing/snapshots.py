"""Runtime snapshots built by hand, for tests and the benchmark: one builder, valid defaults.

Production snapshots come from the database (``apps.core.selectors.snapshot_build``). Tests
and ``bench`` need them without a database; they all use :class:`SnapshotBuilder`, so a new
snapshot field is a change to the schema (with a default, :mod:`runtime.snapshot`) and to the
production builder, and nowhere else. Every ``add_*`` method takes the fields it names plus
``**fields`` passed through to the struct (a test can set a new field without a change here),
and returns the builder, so calls chain::

    world = SnapshotBuilder().add_class("interactive", band=0).add_tenant("acme")
    key = world.add_key("acme-key", "acme")      # the full key; world.secrets holds it too
    world.add_model("tiny", 1).add_endpoint(1, 1, "http://127.0.0.1:8001")
    snapshot = world.snapshot()

Defaults: a tenant is active with generous limits; a key has the ``inference`` scope and a
real key in the production format (:mod:`runtime.contract`); a model has one simulator
version; an endpoint's pool is created on first use with the default policies. The maps are
plain attributes, so a test may also change an entry directly before :meth:`snapshot`.

This lives in ``runtime/`` rather than ``tests/`` because ``bench`` uses it too; nothing on the
request path imports it. No Django here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Self

import msgspec

from runtime import contract
from runtime import snapshot as s


def limits(
    *,
    max_context: int = 4096,
    max_output: int = 512,
    rpm: int = 1000,
    tpm: int = 1_000_000,
    max_concurrency: int = 100,
) -> s.TenantLimits:
    """Tenant limits that stay out of the way unless a test is about them."""
    return s.TenantLimits(
        rpm=rpm, tpm=tpm, max_concurrency=max_concurrency, max_context_tokens=max_context,
        max_output_tokens=max_output,
    )  # fmt: skip


def new_key(prefix: str | None = None) -> tuple[str, str, str]:
    """(full key, prefix, digest) in the production format."""
    key = contract.api_key_new(prefix)
    found = contract.api_key_prefix(key)
    assert found is not None  # api_key_new checked it
    return key, found, contract.api_key_digest(key)


def version_snap(version_id: int, model: str, **fields: Any) -> s.VersionSnap:
    """A simulator version of ``model`` labelled ``v<id>``."""
    values: dict[str, Any] = {
        "label": f"v{version_id}", "digest": "0" * 64, "runtime": "simulator", "memory_gb": 1.0,
    }  # fmt: skip
    return s.VersionSnap(id=version_id, model=model, **{**values, **fields})


def endpoint_snap(
    endpoint_id: int, version_id: int = 1, base_url: str = "", **fields: Any
) -> s.EndpointSnap:
    """A ready endpoint of ``version_id`` in pool ``cpu`` (``http://h<id>`` without a URL)."""
    values: dict[str, Any] = {"pool": "cpu", "state": "ready", "capacity": 8}
    return s.EndpointSnap(
        id=endpoint_id,
        version=version_id,
        base_url=base_url or f"http://h{endpoint_id}",
        **{**values, **fields},
    )


def pool_snap(name: str = "cpu", **fields: Any) -> s.PoolSnap:
    """A pool on the ``cpu`` tier with the default policies."""
    values: dict[str, Any] = {"hardware_tier": "cpu", "max_replicas": 4}
    return s.PoolSnap(name=name, **{**values, **fields})


@dataclass
class SnapshotBuilder:
    """A snapshot under construction, with the full API keys it holds (see the module doc)."""

    tenants: dict[str, s.TenantSnap] = field(default_factory=dict)
    keys: dict[str, s.ApiKeySnap] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)  # key name -> full key
    classes: dict[str, s.RequestClassSnap] = field(default_factory=dict)
    models: dict[str, s.ModelSnap] = field(default_factory=dict)
    versions: dict[int, s.VersionSnap] = field(default_factory=dict)
    pools: dict[str, s.PoolSnap] = field(default_factory=dict)
    endpoints: dict[int, s.EndpointSnap] = field(default_factory=dict)
    routes: dict[str, s.RouteSnap] = field(default_factory=dict)
    prices: list[s.PriceSnap] = field(default_factory=list)
    aliases: dict[str, s.AliasSnap] = field(default_factory=dict)
    signing: s.SigningSnap = field(default_factory=s.SigningSnap)  # adapter signatures

    def add_class(self, name: str, *, band: int, deadline_ms: int = 60_000, **fields: Any) -> Self:
        values: dict[str, Any] = {
            "ttft_slo_ms": min(1000, deadline_ms), "max_queue_length": 100, "shed_order": band,
        }  # fmt: skip
        self.classes[name] = s.RequestClassSnap(
            name=name, priority_band=band, deadline_ms=deadline_ms, **{**values, **fields}
        )
        return self

    def add_tenant(
        self, slug: str, *, tenant_limits: s.TenantLimits | None = None, **fields: Any
    ) -> Self:
        """A tenant (active, weight 1, :func:`limits`); ``fields`` set any TenantSnap field."""
        values: dict[str, Any] = {"name": slug.title(), "limits": tenant_limits or limits()}
        self.tenants[slug] = s.TenantSnap(slug=slug, **{**values, **fields})
        return self

    def add_key(self, name: str, tenant: str, *, full_key: str | None = None, **fields: Any) -> str:
        """A key of ``tenant`` (scope ``inference``): ``full_key``, or a new one; returns it."""
        if full_key is None:
            key, key_prefix, digest = new_key()
        else:
            found = contract.api_key_prefix(full_key)
            if found is None:
                raise ValueError("full_key is not in the API-key format")
            key, key_prefix, digest = full_key, found, contract.api_key_digest(full_key)
        self.keys[key_prefix] = s.ApiKeySnap(
            prefix=key_prefix, digest=digest, tenant=tenant, name=name, **fields
        )
        self.secrets[name] = key
        return key

    def add_model(
        self, name: str, version_id: int, *, task: str = "chat", fallback: str = "",
        **version_fields: Any,
    ) -> Self:  # fmt: skip
        """A model with one published version (``version_fields`` go to its VersionSnap);
        ``fallback`` names the model a ``fallback`` degradation moves its requests to."""
        self.models[name] = s.ModelSnap(
            name=name, task=task, versions=(version_id,), fallback=fallback
        )
        self.versions[version_id] = version_snap(version_id, name, **version_fields)
        return self

    def add_version(self, model: str, version_id: int, **fields: Any) -> Self:
        """Publish another version of ``model`` (it becomes the newest)."""
        snap = self.models[model]
        versions = (*(v for v in snap.versions if v != version_id), version_id)
        self.models[model] = msgspec.structs.replace(snap, versions=versions)
        self.versions[version_id] = version_snap(version_id, model, **fields)
        return self

    def add_adapter(
        self, name: str, version_id: int, *, base_version: int, lora_rank: int = 8,
        **version_fields: Any,
    ) -> Self:  # fmt: skip
        """A LoRA adapter model on ``base_version`` (served by that version's endpoints)."""
        task = self.models[self.versions[base_version].model].task
        return self.add_model(
            name, version_id, task=task, base_version=base_version, lora_rank=lora_rank,
            **version_fields,
        )  # fmt: skip

    def add_pool(self, name: str, **fields: Any) -> Self:
        self.pools[name] = pool_snap(name, **fields)
        return self

    def add_endpoint(
        self, endpoint_id: int, version_id: int, base_url: str = "", *, pool: str = "cpu",
        **fields: Any,
    ) -> Self:  # fmt: skip
        """A ready endpoint (capacity 8); its pool is created on first use."""
        if pool not in self.pools:
            self.add_pool(pool)
        self.endpoints[endpoint_id] = endpoint_snap(
            endpoint_id, version_id, base_url, pool=pool, **fields
        )
        return self

    def add_route(self, model: str, splits: tuple[tuple[int, int], ...], **fields: Any) -> Self:
        """A weighted split over versions of ``model``: ``((version, weight), ...)``."""
        self.routes[model] = s.RouteSnap(
            model=model,
            splits=tuple(s.RouteSplit(version=v, weight=w) for v, w in splits),
            **fields,
        )
        return self

    def add_price(
        self, version_id: int, *, input_per_1k: float, output_per_1k: float, **fields: Any
    ) -> Self:
        values: dict[str, Any] = {"hardware_tier": "cpu"}
        self.prices.append(
            s.PriceSnap(
                version=version_id, input_per_1k=input_per_1k, output_per_1k=output_per_1k,
                **{**values, **fields},
            )
        )  # fmt: skip
        return self

    def add_alias(self, name: str, members: tuple[str, ...], *, task: str = "chat") -> Self:
        """A model alias over published models ``members`` (cheapest fitting one serves)."""
        self.aliases[name] = s.AliasSnap(name=name, task=task, members=members)
        return self

    def snapshot(self, *, version: int = 0, created_at: float | None = None) -> s.Snapshot:
        """The snapshot as built so far (the builder can go on changing afterwards)."""
        return s.Snapshot(
            version=version,
            created_at=time.time() if created_at is None else created_at,
            tenants=dict(self.tenants),
            api_keys=dict(self.keys),
            classes=dict(self.classes),
            models=dict(self.models),
            versions=dict(self.versions),
            pools=dict(self.pools),
            endpoints=dict(self.endpoints),
            routes=dict(self.routes),
            prices=tuple(self.prices),
            aliases=dict(self.aliases),
            signing=self.signing,
        )
