"""snapshot_build(): what the data plane gets from the database, in a fixed number of queries."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from fixtures.control_plane import TIGHT_LIMITS as LIMITS

from apps.batches.models import Batch
from apps.billing.models import Price
from apps.core.selectors import snapshot_build
from apps.models.models import Endpoint, Model, ModelVersion, Pool, Route, RouteSplit
from apps.tenants.models import ApiKey, RequestClass, Tenant
from runtime.snapshot import decode, encode

pytestmark = [pytest.mark.db, pytest.mark.django_db]

MANIFEST = {
    "tokenizer": "tiny-tok",
    "max_context": 2048,
    "default_sampling": {"temperature": 0.7, "top_k": 40, "stop": ["\n"], "echo": False},
    "files": {},
}


def request_class(name: str, band: int) -> RequestClass:
    return RequestClass.objects.create(
        name=name,
        priority_band=band,
        ttft_slo_ms=500 * (band + 1),
        deadline_ms=30_000,
        max_queue_length=100,
        shed_order=5 - band,
    )


def version(model: Model, label: str, *, published: bool, **fields: Any) -> ModelVersion:
    fields.setdefault("manifest", MANIFEST)
    return ModelVersion.objects.create(
        model=model,
        label=label,
        artifact_uri=f"file:///models/{model.name}/{label}",
        digest="a" * 64,
        runtime="vllm",
        published_at=timezone.now() if published else None,
        **fields,
    )


@pytest.fixture
def world() -> dict[str, Any]:
    interactive = request_class("interactive", 0)
    standard = request_class("standard", 1)
    batch = request_class("batch", 2)
    acme = Tenant.objects.create(
        slug="acme", name="Acme", weight=2.0, max_request_bytes=65_536, **LIMITS
    )
    acme.allowed_classes.set([batch, interactive])
    acme.default_class = interactive
    acme.save()
    Tenant.objects.create(slug="idle", name="Idle", status="suspended", **LIMITS)
    now = timezone.now()
    keys = {
        "live": ApiKey.objects.create(
            tenant=acme, name="live", prefix="live0001", digest="1" * 64, scopes=["inference"]
        ),
        "expired": ApiKey.objects.create(
            tenant=acme,
            name="old",
            prefix="expd0001",
            digest="2" * 64,
            scopes=["inference"],
            expires_at=now - dt.timedelta(days=1),
        ),
        "revoked": ApiKey.objects.create(
            tenant=acme, name="gone", prefix="revk0001", digest="3" * 64, revoked_at=now
        ),
    }
    tiny = Model.objects.create(name="tiny", task="chat")
    emb = Model.objects.create(name="emb", task="embedding")
    Model.objects.create(name="draft-only", task="chat")
    v1 = version(tiny, "v1", published=True)
    odd_manifest = {
        "tokenizer": 7,
        "default_sampling": {"temperature": 0.2, "logit_bias": {"1": 2}},
    }
    v2 = version(tiny, "v2", published=True, manifest=odd_manifest, memory_gb=2.5)
    v3 = version(tiny, "v3", published=False)
    e1 = version(emb, "e1", published=True)
    acme.allowed_models.set([emb, tiny])
    version(Model.objects.get(name="draft-only"), "d1", published=False)
    cpu = Pool.objects.create(
        name="cpu",
        hardware_tier="cpu",
        cost_per_replica_hour=Decimal("0.2500"),
        max_replicas=3,
        policies={"fairness": "vtc", "bogus": 3},
    )
    endpoints = {
        "ready": Endpoint.objects.create(
            pool=cpu, version=v2, base_url="http://127.0.0.1:9001", state="ready", capacity=16
        ),
        "gone": Endpoint.objects.create(
            pool=cpu, version=v2, base_url="http://127.0.0.1:9002", state="gone"
        ),
        "unpublished": Endpoint.objects.create(
            pool=cpu, version=v3, base_url="http://127.0.0.1:9003", state="ready"
        ),
    }
    route = Route.objects.create(model=tiny, sticky_key="user")
    RouteSplit.objects.create(route=route, version=v2, weight=90)
    RouteSplit.objects.create(route=route, version=v1, weight=10)
    Price.objects.create(
        version=v1, hardware_tier="cpu", input_per_1k=Decimal("0.1"), output_per_1k=Decimal("0.3"),
        batch_discount=Decimal("0.4"),
    )
    Price.objects.create(
        version=v3, hardware_tier="cpu", input_per_1k=Decimal("1"), output_per_1k=Decimal("1")
    )
    return {
        "classes": (interactive, standard, batch),
        "keys": keys,
        "versions": {"v1": v1, "v2": v2, "v3": v3, "e1": e1},
        "endpoints": endpoints,
    }


def test_tenants_classes_and_keys(world: dict[str, Any]) -> None:
    snapshot = snapshot_build()
    assert snapshot.version == 0
    assert list(snapshot.classes) == ["interactive", "standard", "batch"]
    assert snapshot.classes["standard"].ttft_slo_ms == 1000
    acme = snapshot.tenants["acme"]
    assert acme.status == "active"
    assert acme.weight == 2.0
    assert acme.limits.rpm == 60
    assert acme.limits.max_output_tokens == 512
    assert acme.classes == ("interactive", "batch")  # most urgent first
    assert acme.default_class == "interactive"
    assert acme.models == ("emb", "tiny")
    assert acme.max_request_bytes == 65_536
    idle = snapshot.tenants["idle"]
    assert (idle.status, idle.classes, idle.default_class) == ("suspended", (), "")
    assert idle.max_request_bytes == 0  # no cap of its own
    assert idle.models == ()  # no entitlement rows: every model

    assert set(snapshot.api_keys) == {"live0001", "expd0001"}  # revoked keys are left out
    live = snapshot.api_keys["live0001"]
    assert (live.tenant, live.digest, live.scopes, live.expires_at) == (
        "acme",
        "1" * 64,
        ("inference",),
        None,
    )
    expired = world["keys"]["expired"]
    assert snapshot.api_keys["expd0001"].expires_at == expired.expires_at.timestamp()


def test_a_batch_executor_key_is_marked_batch(world: dict[str, Any]) -> None:
    live = world["keys"]["live"]
    assert not snapshot_build().api_keys["live0001"].batch
    Batch.objects.create(public_id="batch_x", tenant=live.tenant, endpoint="/v1/completions",
                         expires_at=timezone.now(), exec_key_prefix=live.prefix)  # fmt: skip
    snapshot = snapshot_build()
    assert snapshot.api_keys["live0001"].batch  # its requests are priced as batch lines
    assert not snapshot.api_keys["expd0001"].batch


def test_models_versions_routes_endpoints_prices(world: dict[str, Any]) -> None:
    snapshot = snapshot_build()
    v = {label: mv.pk for label, mv in world["versions"].items()}
    assert set(snapshot.models) == {"tiny", "emb"}  # a model with no published version is out
    assert snapshot.models["tiny"].versions == (v["v1"], v["v2"])  # oldest -> newest published
    assert snapshot.models["emb"].task == "embedding"
    assert set(snapshot.versions) == {v["v1"], v["v2"], v["e1"]}

    full = snapshot.versions[v["v1"]]
    assert (full.tokenizer, full.max_context, full.runtime) == ("tiny-tok", 2048, "vllm")
    assert full.default_sampling == {
        "temperature": 0.7,
        "top_k": 40,
        "stop": ("\n",),
        "echo": False,
    }
    odd = snapshot.versions[v["v2"]]  # odd manifest values are coerced, never fatal
    assert (odd.tokenizer, odd.max_context, odd.memory_gb) == ("", 0, 2.5)
    assert odd.default_sampling == {"temperature": 0.2}

    assert snapshot.routes["tiny"].sticky_key == "user"
    assert [(s.version, s.weight) for s in snapshot.routes["tiny"].splits] == [
        (v["v1"], 10),
        (v["v2"], 90),
    ]
    assert "emb" not in snapshot.routes  # no route: the router uses the newest published version

    assert snapshot.pools["cpu"].cost_per_replica_hour == 0.25
    assert snapshot.pools["cpu"].policies == {"fairness": "vtc"}
    ready = world["endpoints"]["ready"]
    assert list(snapshot.endpoints) == [ready.pk]  # not gone, not of an unpublished version
    assert snapshot.endpoints[ready.pk].capacity == 16
    assert snapshot.endpoints[ready.pk].pool == "cpu"

    assert [(p.version, p.hardware_tier) for p in snapshot.prices] == [(v["v1"], "cpu")]
    assert snapshot.prices[0].output_per_1k == pytest.approx(0.3)
    assert snapshot.prices[0].cache_hit_discount == 0.5
    assert snapshot.prices[0].batch_discount == pytest.approx(0.4)


def test_route_left_with_no_published_split_is_omitted(world: dict[str, Any]) -> None:
    emb = Model.objects.get(name="emb")
    draft = version(emb, "e2", published=False)
    route = Route.objects.create(model=emb)
    RouteSplit.objects.create(route=route, version=draft, weight=1)
    assert "emb" not in snapshot_build().routes


def test_round_trips_through_json(world: dict[str, Any]) -> None:
    snapshot = snapshot_build()
    assert decode(encode(snapshot)) == snapshot


def test_query_count_does_not_grow_with_rows(
    world: dict[str, Any], django_assert_max_num_queries: Any
) -> None:
    interactive, standard, batch = world["classes"]
    tiny = Model.objects.get(name="tiny")
    cpu = Pool.objects.get(name="cpu")
    for i in range(15):
        tenant = Tenant.objects.create(slug=f"t{i}", name=f"T{i}", default_class=standard, **LIMITS)
        tenant.allowed_classes.set([interactive, standard, batch])
        ApiKey.objects.create(tenant=tenant, name="k", prefix=f"k{i:07d}", digest=f"{i:064d}")
        mv = version(tiny, f"x{i}", published=True)
        Endpoint.objects.create(pool=cpu, version=mv, base_url=f"http://10.0.0.{i}:8000")
        Price.objects.create(version=mv, hardware_tier="cpu", input_per_1k=1, output_per_1k=1)
        Pool.objects.create(name=f"pool-{i}", hardware_tier="cpu")
    # 17 queries: + credit settings (#11), + running rollouts' route exclusions (#15),
    # + scale-from-zero versions (#16), + model aliases (#33), + safety packs and their
    # attachments (#31); 18: + the Batch API's executor keys (#32).
    with django_assert_max_num_queries(18):
        snapshot = snapshot_build()
    assert len(snapshot.tenants) == 17
    assert len(snapshot.models["tiny"].versions) == 17
