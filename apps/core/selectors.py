"""Reads that span the apps: building the runtime snapshot from the database (docs/design.md).

:func:`snapshot_build` compiles everything the data plane holds into one
:class:`runtime.snapshot.Snapshot`. It reads in one REPEATABLE READ transaction, so the
document is a consistent picture of the database even while writes go on, and it takes a fixed
number of queries whatever the number of rows.

What goes in (see the invariants in :mod:`runtime.snapshot`):

- tenants with their limits, entitled classes (most urgent first) and default class;
- API keys that are not revoked; expired keys are kept with ``expires_at`` so the gateway can
  say "expired";
- every request class;
- models that have at least one published version, with those versions oldest → newest
  published; unpublished versions are left out, and so are endpoints and prices of them;
- pools with their policy names; endpoints that are not "gone";
- routes with their splits. A model with no route gets no entry in ``routes``: the router then
  sends its traffic to the model's newest published version.
- prices per version and hardware tier;
- safety: each policy pack name's newest version and the packs per tenant and per model.

The stored values were validated by the services that wrote them; a value that still does not
fit the schema (an odd manifest, a non-string policy name) is coerced or dropped with a warning
here rather than stopping every publish.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Prefetch, Q

from apps.batches.models import Batch
from apps.billing.models import Price
from apps.models.models import Endpoint, Model, ModelVersion, Pool, Route, RouteSplit
from apps.models.selectors import trusted_keys_active
from apps.rollouts.models import TRAFFIC_STATES, Rollout
from apps.safety.selectors import safety_snapshot
from apps.scaling.selectors import scale_from_zero_versions
from apps.tenants.models import ApiKey, RequestClass, Tenant
from runtime.snapshot import (
    AliasSnap,
    ApiKeySnap,
    CachePolicySnap,
    CreditSnap,
    EndpointSnap,
    ModelSnap,
    PoolSnap,
    PriceSnap,
    RequestClassSnap,
    RouteSnap,
    SamplingValue,
    SigningSnap,
    Snapshot,
    TenantLimits,
    TenantSnap,
    VersionSnap,
)
from runtime.snapshot import (
    RouteSplit as RouteSplitSnap,
)

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _consistent_read() -> Iterator[None]:
    """One read-only REPEATABLE READ transaction, unless the caller already holds one."""
    if connection.in_atomic_block or connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def snapshot_build() -> Snapshot:
    """Build the runtime snapshot from the database; its ``version`` is 0 until published."""
    with _consistent_read():
        classes = _request_classes()
        tenants = _tenants()
        api_keys = _api_keys()
        models, versions = _models_and_versions()
        aliases = _aliases(models)
        pools = _pools()
        endpoints = _endpoints(versions)
        routes = _routes(versions)
        prices = _prices(versions)
        credits = _credits()
        safety = safety_snapshot()
        signing = _signing(versions)
    return Snapshot(
        version=0,
        created_at=time.time(),
        tenants=tenants,
        api_keys=api_keys,
        classes=classes,
        models=models,
        versions=versions,
        pools=pools,
        endpoints=endpoints,
        routes=routes,
        prices=prices,
        credits=credits,
        aliases=aliases,
        safety=safety,
        signing=signing,
    )


def _signing(versions: Mapping[int, VersionSnap]) -> SigningSnap:
    """What routers check adapters' signatures with (empty without adapters): the mode of
    ``settings.ARTIFACT_SIGNATURES`` and the active trusted keys, as a worker reads them."""
    if not any(v.base_version is not None for v in versions.values()):
        return SigningSnap()
    return SigningSnap(
        required=settings.ARTIFACT_SIGNATURES == "required", trusted=trusted_keys_active()
    )


def _request_classes() -> dict[str, RequestClassSnap]:
    return {
        rc.name: RequestClassSnap(
            name=rc.name,
            priority_band=rc.priority_band,
            ttft_slo_ms=rc.ttft_slo_ms,
            deadline_ms=rc.deadline_ms,
            max_queue_length=rc.max_queue_length,
            shed_order=rc.shed_order,
            heartbeat_ms=rc.heartbeat_ms,
            itl_slo_ms=rc.itl_slo_ms,
        )
        for rc in RequestClass.objects.order_by("priority_band", "name")
    }


def _tenants() -> dict[str, TenantSnap]:
    queryset = (
        Tenant.objects.select_related("default_class")
        .prefetch_related(
            Prefetch(
                "allowed_classes",
                queryset=RequestClass.objects.order_by("priority_band", "name"),
            ),
            Prefetch("allowed_models", queryset=Model.objects.order_by("name")),
        )
        .order_by("slug")
    )
    return {
        t.slug: TenantSnap(
            slug=t.slug,
            name=t.name,
            status=t.status,
            weight=float(t.weight),
            limits=TenantLimits(
                rpm=t.rpm_limit,
                tpm=t.tpm_limit,
                max_concurrency=t.max_concurrency,
                max_context_tokens=t.max_context_tokens,
                max_output_tokens=t.max_output_tokens,
            ),
            classes=tuple(rc.name for rc in t.allowed_classes.all()),
            default_class=t.default_class.name if t.default_class is not None else "",
            models=tuple(m.name for m in t.allowed_models.all()),
            max_request_bytes=t.max_request_bytes,
            result_cache=t.result_cache,
            zero_retention=t.zero_retention,
        )
        for t in queryset
    }


def _api_keys() -> dict[str, ApiKeySnap]:
    queryset = list(
        ApiKey.objects.filter(revoked_at__isnull=True).select_related("tenant").order_by("prefix")
    )
    # The keys the Batch API minted for its executor: their requests are batch lines.
    batch_keys = set(
        Batch.objects.filter(exec_key_prefix__in=[key.prefix for key in queryset]).values_list(
            "exec_key_prefix", flat=True
        )
    )
    return {
        key.prefix: ApiKeySnap(
            prefix=key.prefix,
            digest=key.digest,
            tenant=key.tenant.slug,
            name=key.name,
            scopes=_strings(key.scopes, where=f"API key {key.prefix} scopes"),
            expires_at=key.expires_at.timestamp() if key.expires_at is not None else None,
            batch=key.prefix in batch_keys,
        )
        for key in queryset
    }


def _models_and_versions() -> tuple[dict[str, ModelSnap], dict[int, VersionSnap]]:
    queryset = (
        ModelVersion.objects.filter(published_at__isnull=False)
        .select_related("model", "model__fallback", "signing_key")
        .order_by("model__name", "published_at", "id")
    )
    versions: dict[int, VersionSnap] = {}
    per_model: dict[str, list[int]] = {}
    tasks: dict[str, str] = {}
    refused: dict[str, tuple[str, ...]] = {}
    caches: dict[str, CachePolicySnap] = {}
    fallbacks: dict[str, str] = {}
    scalable = scale_from_zero_versions()  # apps/scaling
    for mv in queryset:
        manifest = mv.manifest if isinstance(mv.manifest, Mapping) else {}
        where = f"version {mv.model.name}:{mv.label}"
        versions[mv.pk] = VersionSnap(
            id=mv.pk,
            model=mv.model.name,
            label=mv.label,
            artifact_uri=mv.artifact_uri,
            digest=mv.digest,
            runtime=mv.runtime,
            max_context=_positive_int(manifest.get("max_context"), where=f"{where} max_context"),
            tokenizer=_string(manifest.get("tokenizer"), where=f"{where} tokenizer"),
            default_sampling=_sampling(manifest.get("default_sampling"), where=where),
            memory_gb=float(mv.memory_gb),
            tensor_parallel_size=mv.tensor_parallel_size,
            # An adapter runs on its base version's replicas: it scales from zero with them.
            scale_pool=scalable.get(mv.base_version_id or mv.pk, ("", 0.0))[0],
            cold_start_s=scalable.get(mv.base_version_id or mv.pk, ("", 0.0))[1],
            capabilities=_strings(mv.capabilities, where=f"{where} capabilities"),
            base_version=mv.base_version_id,
            lora_rank=_positive_int(manifest.get("lora_rank"), where=f"{where} lora_rank")
            if mv.base_version_id is not None
            else 0,
            signature=mv.signature if mv.base_version_id is not None else "",
            signing_key=mv.signing_key.name
            if mv.base_version_id is not None and mv.signing_key is not None
            else "",
        )
        per_model.setdefault(mv.model.name, []).append(mv.pk)
        tasks[mv.model.name] = mv.model.task
        refused[mv.model.name] = tuple(mv.model.refused_fields or ())
        fallbacks[mv.model.name] = mv.model.fallback.name if mv.model.fallback else ""
        caches[mv.model.name] = CachePolicySnap(
            enabled=mv.model.cache_enabled, shared=mv.model.cache_shared,
            ttl_s=mv.model.cache_ttl_s,
        )  # fmt: skip
    models = {
        name: ModelSnap(
            name=name,
            task=tasks[name],
            versions=tuple(ids),
            refused_fields=refused[name],
            cache=caches[name],
            # only a fallback with a published version (the snapshot's models)
            fallback=fallbacks[name] if fallbacks[name] in per_model else "",
        )
        for name, ids in per_model.items()
    }
    return models, versions


def _aliases(models: Mapping[str, ModelSnap]) -> dict[str, AliasSnap]:
    """Each alias with its members that have a published version (none: left out)."""
    aliases: dict[str, AliasSnap] = {}
    for alias in Model.objects.exclude(members=[]).order_by("name"):
        where = f"alias {alias.name} members"
        members = tuple(m for m in _strings(alias.members, where=where) if m in models)
        if members:
            aliases[alias.name] = AliasSnap(name=alias.name, task=alias.task, members=members)
    return aliases


def _pools() -> dict[str, PoolSnap]:
    return {
        pool.name: PoolSnap(
            name=pool.name,
            hardware_tier=pool.hardware_tier,
            cost_per_replica_hour=float(pool.cost_per_replica_hour),
            min_replicas=pool.min_replicas,
            max_replicas=pool.max_replicas,
            warm_replicas=pool.warm_replicas,
            policies=_policies(pool.policies, where=f"pool {pool.name} policies"),
        )
        for pool in Pool.objects.order_by("name")
    }


def _endpoints(versions: Mapping[int, VersionSnap]) -> dict[int, EndpointSnap]:
    queryset = (
        Endpoint.objects.exclude(state=Endpoint.State.GONE)
        .filter(version_id__in=list(versions))
        .select_related("pool")
        .order_by("id")
    )
    return {
        ep.pk: EndpointSnap(
            id=ep.pk,
            pool=ep.pool.name,
            version=ep.version_id,
            base_url=ep.base_url,
            state=ep.state,
            capacity=ep.capacity,
            kv_events=ep.kv_events_url,
        )
        for ep in queryset
    }


def _routes(versions: Mapping[int, VersionSnap]) -> dict[str, RouteSnap]:
    queryset = (
        Route.objects.select_related("model")
        .prefetch_related(Prefetch("splits", queryset=RouteSplit.objects.order_by("version_id")))
        .order_by("model__name")
    )
    rollouts = {r.model_id: r for r in Rollout.objects.filter(state__in=TRAFFIC_STATES)}
    routes: dict[str, RouteSnap] = {}
    for route in queryset:
        splits = tuple(
            RouteSplitSnap(version=split.version_id, weight=split.weight)
            for split in route.splits.all()
            if split.version_id in versions
        )
        if not splits:
            # Nothing routable: the router falls back to the newest published version.
            continue
        routes[route.model.name] = RouteSnap(
            model=route.model.name,
            splits=splits,
            sticky_key=route.sticky_key,
            **_rollout_route_fields(rollouts.get(route.model_id), versions),
        )
    return routes


def _rollout_route_fields(
    rollout: Rollout | None, versions: Mapping[int, VersionSnap]
) -> dict[str, Any]:
    """A running or paused rollout's route fields: exclusions, sticky header, shadow share."""
    if rollout is None or rollout.stable_version_id not in versions:
        return {}
    fields: dict[str, Any] = {
        "stable_version": rollout.stable_version_id,
        "exclude_tenants": tuple(sorted(rollout.excluded_tenants)),
        "sticky_header": rollout.sticky_header,
    }
    if rollout.mode == Rollout.Mode.SHADOW and rollout.candidate_version_id in versions:
        fields["shadow_version"] = rollout.candidate_version_id
        fields["shadow_share"] = int(rollout.steps[0]) / 100.0
    return fields


def _prices(versions: Mapping[int, VersionSnap]) -> tuple[PriceSnap, ...]:
    queryset = Price.objects.filter(version_id__in=list(versions)).order_by(
        "version_id", "hardware_tier"
    )
    return tuple(
        PriceSnap(
            version=price.version_id,
            hardware_tier=price.hardware_tier,
            input_per_1k=float(price.input_per_1k),
            output_per_1k=float(price.output_per_1k),
            cache_hit_discount=float(price.cache_hit_discount),
            batch_discount=float(price.batch_discount),
        )
        for price in queryset
    )


def _credits() -> dict[str, CreditSnap]:
    """Credit settings of every tenant that has an account or a budget (billing's part; one
    query: a row per budget, or one without)."""
    rows = (
        Tenant.objects.filter(Q(credit_account__isnull=False) | Q(budgets__isnull=False))
        .values_list("slug", "credit_account__overdraft", "budgets__period", "budgets__hard_cap")
        .order_by("slug")
    )
    out: dict[str, dict[str, Any]] = {}
    for slug, overdraft, period, cap in rows:
        values = out.setdefault(slug, {})
        if overdraft:
            values["overdraft"] = overdraft
        if period:
            values[f"{period}_cap"] = float(cap)
    return {slug: CreditSnap(**values) for slug, values in out.items()}


# -- coercion of stored JSON into the schema's types ------------------------------------------


def _string(value: object, *, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is not None:
        logger.warning("snapshot: %s is not a string (%r); left empty", where, value)
    return ""


def _positive_int(value: object, *, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    logger.warning("snapshot: %s is not a positive integer (%r); 0 = unknown", where, value)
    return 0


def _strings(value: object, *, where: str) -> tuple[str, ...]:
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    logger.warning("snapshot: %s is not a list of strings (%r); left empty", where, value)
    return ()


def _policies(value: object, *, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        logger.warning("snapshot: %s is not an object (%r); left empty", where, value)
        return {}
    policies: dict[str, str] = {}
    for name, impl in value.items():
        if isinstance(impl, str):
            policies[str(name)] = impl
        else:
            logger.warning("snapshot: %s[%r] is not a string (%r); dropped", where, name, impl)
    return policies


def _sampling(value: object, *, where: str) -> dict[str, SamplingValue]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        logger.warning("snapshot: %s default_sampling is not an object; left empty", where)
        return {}
    sampling: dict[str, SamplingValue] = {}
    for name, item in value.items():
        if item is None or isinstance(item, bool | int | float | str):
            sampling[str(name)] = item
        elif isinstance(item, list | tuple) and all(isinstance(s, str) for s in item):
            sampling[str(name)] = tuple(item)
        else:
            logger.warning(
                "snapshot: %s default_sampling[%r] has an unsupported value %r; dropped",
                where,
                name,
                item,
            )
    return sampling
