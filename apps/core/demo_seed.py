"""The demo data `switchyard up` seeds once: classes, tenants with keys and credits, an operator,
a CPU pool, the demo model (helper command ``make_demo_model``), two LoRA adapters on it
(``make_demo_adapter``) and their prices, and the demo
pools' autoscaling settings (the version the local actuator starts). The demo versions are
signed with the demo key (apps.models.demo_signing) so workers requiring signatures serve them.

Every write goes through the apps' services. Each step is idempotent on its own (an existing
request class, tenant, user, pool, model or price is left as it is), so a second run creates
nothing, and secrets — the operator's password and the API keys — come back only from the run
that created them.
"""

from __future__ import annotations

import io
import json
import secrets
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import transaction
from redis.exceptions import RedisError

from apps.billing.ledger import credit_reconcile
from apps.billing.models import Price
from apps.billing.services import credit_grant, price_set
from apps.common.audit import audit_record
from apps.models.demo_encoder import EncoderPackageMissingError, demo_encoder_register
from apps.models.demo_signing import demo_sign
from apps.models.models import ModelVersion, Pool
from apps.models.services import pool_create, pool_update
from apps.scaling.models import PoolScaling
from apps.scaling.services import pool_scaling_get_or_create, pool_scaling_update
from apps.tenants.models import RequestClass, Tenant
from apps.tenants.services import api_key_create, request_class_create, tenant_create

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

OPERATOR_USERNAME = "operator"
POOL_NAME = "cpu"
HARDWARE_TIER = "cpu"

REQUEST_CLASSES: tuple[dict[str, Any], ...] = (
    {"name": "interactive", "priority_band": 0, "ttft_slo_ms": 500, "deadline_ms": 30_000,
     "max_queue_length": 256, "shed_order": 4},
    {"name": "standard", "priority_band": 1, "ttft_slo_ms": 2_000, "deadline_ms": 60_000,
     "max_queue_length": 1_024, "shed_order": 3},
    {"name": "batch", "priority_band": 2, "ttft_slo_ms": 30_000, "deadline_ms": 600_000,
     "max_queue_length": 10_000, "shed_order": 1},
)  # fmt: skip

TENANTS: tuple[dict[str, Any], ...] = (
    {"slug": "acme", "name": "Acme Corporation", "weight": 2.0, "rpm_limit": 600,
     "tpm_limit": 200_000, "max_concurrency": 16, "max_context_tokens": 2_048,
     "max_output_tokens": 512, "credits": Decimal(1_000)},
    {"slug": "globex", "name": "Globex Corporation", "weight": 1.0, "rpm_limit": 300,
     "tpm_limit": 100_000, "max_concurrency": 8, "max_context_tokens": 2_048,
     "max_output_tokens": 512, "credits": Decimal(500)},
)  # fmt: skip

DEMO_PRICE = {"input_per_1k": Decimal("0.0100"), "output_per_1k": Decimal("0.0300")}
# The demo LoRA adapters on demo-llama (make_demo_adapter --seed N), billed at their own price.
DEMO_ADAPTER_SEEDS = (1, 2)
ADAPTER_PRICE = {"input_per_1k": Decimal("0.0120"), "output_per_1k": Decimal("0.0360")}


@dataclass(kw_only=True)
class SeedResult:
    """What a seeding run did. Secrets are set only by the run that created them."""

    created: list[str] = field(default_factory=list)
    operator_username: str = OPERATOR_USERNAME
    operator_password: str | None = None
    api_keys: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.created)

    def as_json(self) -> str:
        return json.dumps(asdict(self))


def _request_classes(result: SeedResult) -> None:
    for values in REQUEST_CLASSES:
        if not RequestClass.objects.filter(name=values["name"]).exists():
            request_class_create(actor=None, **values)
            result.created.append(f"request class {values['name']}")


def _tenants(result: SeedResult) -> None:
    names = [values["name"] for values in REQUEST_CLASSES]
    for spec in TENANTS:
        values = {key: value for key, value in spec.items() if key != "credits"}
        if Tenant.objects.filter(slug=values["slug"]).exists():
            continue
        tenant = tenant_create(
            actor=None, **values, allowed_classes=names, default_class="standard"
        )
        _key, full_key = api_key_create(actor=None, tenant=tenant, name="demo")
        credit_grant(actor=None, tenant=tenant, amount=spec["credits"], reason="demo credits")
        result.api_keys[tenant.slug] = full_key
        result.created.append(f"tenant {tenant.slug} with an API key and {spec['credits']} credits")


def _operator(result: SeedResult) -> None:
    user_model = get_user_model()
    if user_model.objects.filter(username=OPERATOR_USERNAME).exists():
        return
    password = secrets.token_urlsafe(12)
    user = user_model.objects.create_superuser(
        username=OPERATOR_USERNAME, email="", password=password
    )
    audit_record(
        actor=None,
        action="user.create_superuser",
        target=user,
        after={"username": OPERATOR_USERNAME, "is_superuser": True, "reason": "demo seed"},
    )
    result.operator_password = password
    result.created.append(f"operator login {OPERATOR_USERNAME}")


# The demo pools' replica bounds: `up`'s autoscaler (local actuator) keeps one replica of each
# (a vLLM cold start is ~35-60 s on a 2-core CPU box) and adds a second under load. Set
# min_replicas 0 in the admin to let a pool go to zero after its idle time.
DEMO_MIN, DEMO_MAX = 1, 2
DEMO_REPLICAS = {"min_replicas": DEMO_MIN, "max_replicas": DEMO_MAX}
DEMO_SCALING = {"idle_to_zero_s": 600.0, "in_cooldown_s": 120.0}


def _pool(result: SeedResult) -> None:
    if Pool.objects.filter(name=POOL_NAME).exists():
        return
    pool_create(
        actor=None,
        name=POOL_NAME,
        hardware_tier=HARDWARE_TIER,
        cost_per_replica_hour=Decimal("0.10"),
        min_replicas=DEMO_MIN,
        max_replicas=DEMO_MAX,
    )
    result.created.append(f"pool {POOL_NAME} (tier {HARDWARE_TIER})")


def _autoscaled(result: SeedResult, pool_name: str, version: ModelVersion) -> None:
    """The pool's scaling settings naming the version the autoscaler starts (once; a pool an
    earlier seed made with min 0 and a fixed worker gets the demo bounds)."""
    pool = Pool.objects.get(name=pool_name)
    if PoolScaling.objects.filter(pool=pool, version__isnull=False).exists():
        return
    if pool.min_replicas == 0 and not PoolScaling.objects.filter(pool=pool).exists():
        pool_update(actor=None, pool=pool, **DEMO_REPLICAS)
    scaling = pool_scaling_get_or_create(pool=pool)
    pool_scaling_update(actor=None, scaling=scaling, version_id=version.pk, **DEMO_SCALING)
    result.created.append(f"autoscaling of pool {pool_name} ({version})")


def _demo_model(result: SeedResult, *, stdout: SupportsWrite[str]) -> None:
    """Generate + register the demo model (idempotent, apps.models) and price it on CPU."""
    stdout.write("demo model: generating (first run) or verifying the files ...\n")
    out = io.StringIO()
    call_command("make_demo_model", "--json", stdout=out)
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    version = ModelVersion.objects.select_related("model").get(pk=summary["version_id"])
    if summary["version_created"]:
        result.created.append(f"model version {version} ({summary['path']})")
    if summary["signed_now"]:
        result.created.append(f"demo signature of {version}")
    if not Price.objects.filter(version=version, hardware_tier=HARDWARE_TIER).exists():
        price_set(actor=None, version=version, hardware_tier=HARDWARE_TIER, **DEMO_PRICE)
        result.created.append(f"price of {version} on {HARDWARE_TIER}")
    _autoscaled(result, POOL_NAME, version)


def _demo_adapters(result: SeedResult) -> None:
    """The demo LoRA adapters on the demo model (apps.models.demo_adapter), priced."""
    for seed in DEMO_ADAPTER_SEEDS:
        out = io.StringIO()
        call_command("make_demo_adapter", "--seed", str(seed), "--json", stdout=out)
        summary = json.loads(out.getvalue().strip().splitlines()[-1])
        version = ModelVersion.objects.select_related("model").get(pk=summary["version_id"])
        if summary["version_created"]:
            result.created.append(f"adapter {version} on {summary['base']}")
        if not Price.objects.filter(version=version, hardware_tier=HARDWARE_TIER).exists():
            price_set(actor=None, version=version, hardware_tier=HARDWARE_TIER, **ADAPTER_PRICE)
            result.created.append(f"price of {version} on {HARDWARE_TIER}")


def _credits_to_routers(*, stdout: SupportsWrite[str]) -> None:
    """Seed the routers' Redis balances from the ledger (a fresh or restarted Redis)."""
    try:
        repairs = credit_reconcile()
    except (RedisError, OSError, TimeoutError) as exc:
        stdout.write(f"credit balances: Redis not reachable ({exc}); beat seeds them later\n")
        return
    if repairs:
        stdout.write(f"credit balances loaded into Redis for {len(repairs)} tenant(s)\n")


ENCODER_POOL_NAME = "encoder-cpu"
ENCODER_PRICE = {"input_per_1k": Decimal("0.0010"), "output_per_1k": Decimal("0.0000")}


def _demo_encoder(result: SeedResult, *, stdout: SupportsWrite[str]) -> None:
    """Register the demo encoder (apps.models.demo_encoder) in its own CPU pool, priced."""
    try:
        registration = demo_encoder_register(actor=None)
    except EncoderPackageMissingError as exc:
        stdout.write(f"demo encoder skipped: {exc}\n")
        return
    version = registration.version
    if registration.created:
        result.created.append(f"model version {version} (torch)")
    if demo_sign(version=version, var_dir=Path(settings.VAR_DIR)):
        result.created.append(f"demo signature of {version}")
    if not Pool.objects.filter(name=ENCODER_POOL_NAME).exists():
        pool_create(
            actor=None, name=ENCODER_POOL_NAME, hardware_tier=HARDWARE_TIER,
            cost_per_replica_hour=Decimal("0.05"), min_replicas=DEMO_MIN, max_replicas=DEMO_MAX,
        )  # fmt: skip
        result.created.append(f"pool {ENCODER_POOL_NAME} (tier {HARDWARE_TIER})")
    if not Price.objects.filter(version=version, hardware_tier=HARDWARE_TIER).exists():
        price_set(actor=None, version=version, hardware_tier=HARDWARE_TIER, **ENCODER_PRICE)
        result.created.append(f"price of {version} on {HARDWARE_TIER}")
    _autoscaled(result, ENCODER_POOL_NAME, version)


def demo_seed(*, stdout: SupportsWrite[str]) -> SeedResult:
    """Seed the demo data where it is missing; say what was created on ``stdout``."""
    result = SeedResult()
    with transaction.atomic():
        _request_classes(result)
        _tenants(result)
        _operator(result)
        _pool(result)
        _demo_model(result, stdout=stdout)
        _demo_adapters(result)
        _demo_encoder(result, stdout=stdout)
    _credits_to_routers(stdout=stdout)
    for line in result.created:
        stdout.write(f"created {line}\n")
    if not result.changed:
        stdout.write("demo data already present; nothing created\n")
    return result
