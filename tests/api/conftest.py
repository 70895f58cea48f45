"""Fixtures for the REST API tests: two tenants with members of every role, management
tokens, API keys, budgets, grants and usage, a small registry, and clients for each caller."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.utils import timezone
from fixtures.control_plane import LIMITS
from rest_framework.test import APIClient

from apps.billing.services import budget_set, credit_grant, price_set, usage_record_create
from apps.models.models import Model, ModelVersion, Pool
from apps.models.services import (
    endpoint_register,
    model_create,
    model_version_create,
    model_version_publish,
    pool_create,
    route_set,
)
from apps.tenants.models import ApiKey, ManagementToken, Membership, Tenant
from apps.tenants.services import (
    api_key_create,
    membership_create,
    request_class_create,
    tenant_create,
)
from apps.tenants.services.management_tokens import management_token_create
from runtime.artifacts import manifest_digest

ROLES = ("owner", "admin", "viewer")


def manifest() -> dict[str, Any]:
    return {
        "tokenizer": "hf-internal-testing/llama-tokenizer",
        "max_context": 2048,
        "default_sampling": {"temperature": 0.7},
        "files": {"model.safetensors": "cd" * 32},
    }


@dataclass
class Side:
    """One tenant and everything it owns."""

    tenant: Tenant
    users: dict[str, Any]
    tokens: dict[str, tuple[ManagementToken, str]]
    key: ApiKey
    key_secret: str
    event_ids: list[str] = field(default_factory=list)


@dataclass
class World:
    a: Side
    b: Side
    staff: Any
    model: Model
    version: ModelVersion
    pool: Pool


def _side(slug: str, classes: list[str], version: ModelVersion) -> Side:
    tenant = tenant_create(
        actor=None,
        slug=slug,
        name=f"{slug.title()} Corp",
        **LIMITS,
        allowed_classes=classes,
        default_class=classes[0],
    )
    user_model = get_user_model()
    users = {}
    for role in ROLES:
        user = user_model.objects.create_user(username=f"{slug}-{role}", password="pw-123456")
        membership_create(actor=None, user=user, tenant=tenant, role=role)
        users[role] = user
    tokens = {
        role: management_token_create(
            actor=users["owner"], tenant=tenant, name=f"{role} token", role=role
        )
        for role in ROLES
    }
    key, secret = api_key_create(actor=None, tenant=tenant, name=f"{slug}-ci")
    budget_set(actor=None, tenant=tenant, period="day", soft_alert_pct=80, hard_cap="100")
    credit_grant(actor=None, tenant=tenant, amount="50", reason=f"welcome {slug}")
    side = Side(tenant, users, tokens, key, secret)
    now = timezone.now()
    for i, request_class in enumerate([classes[0], classes[0], classes[-1]]):
        event_id = f"{slug}-event-{i}"
        usage_record_create(
            event_id=event_id,
            tenant=tenant,
            api_key=key,
            version=version,
            request_class=request_class,
            tokens_in=10 * (i + 1),
            tokens_out=5,
            credits=Decimal("0.5"),
            cached=False,
            outcome="ok",
            occurred_at=now - dt.timedelta(days=i),
        )
        side.event_ids.append(event_id)
    return side


@pytest.fixture
def world(db: Any) -> World:
    for name, band in (("interactive", 0), ("standard", 1), ("batch", 2)):
        request_class_create(
            actor=None,
            name=name,
            priority_band=band,
            ttft_slo_ms=500,
            deadline_ms=60_000,
            max_queue_length=100,
            shed_order=3 - band,
        )
    model = model_create(actor=None, name="tiny-llama", task="chat")
    version = model_version_create(
        actor=None,
        model=model,
        label="v1",
        artifact_uri="file:///models/tiny-llama/v1",
        digest=manifest_digest(manifest()["files"]),
        manifest=manifest(),
        runtime="vllm",
    )
    version = model_version_publish(actor=None, version=version)
    pool = pool_create(actor=None, name="cpu-pool", hardware_tier="cpu", cost_per_replica_hour="1")
    endpoint_register(
        actor=None, pool=pool, version=version, base_url="http://127.0.0.1:9", capacity=4
    )
    route_set(actor=None, model=model, splits=[(version, 1)])
    price_set(actor=None, version=version, hardware_tier="cpu", input_per_1k="1", output_per_1k="2")
    a = _side("acme", ["interactive", "standard"], version)
    b = _side("globex", ["standard", "batch"], version)
    staff = get_user_model().objects.create_user(
        username="operator", password="pw-123456", is_staff=True
    )
    return World(a=a, b=b, staff=staff, model=model, version=version, pool=pool)


@pytest.fixture(autouse=True)
def _api_test_settings(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()


def session_client(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def etag_patch(client: APIClient, url: str, data: dict[str, Any]) -> Any:
    """PATCH ``url`` with the ETag a GET of it returns as If-Match."""
    etag = client.get(url)["ETag"]
    return client.patch(url, data, format="json", HTTP_IF_MATCH=etag)


def token_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


Caller = tuple[str, Callable[[], APIClient]]


def callers_of(side: Side) -> list[tuple[str, str, APIClient]]:
    """(label, role, client) for every member session and every token of the tenant."""
    result = [(f"session:{role}", role, session_client(side.users[role])) for role in ROLES]
    result += [(f"token:{role}", role, token_client(side.tokens[role][1])) for role in ROLES]
    return result


@pytest.fixture
def staff_client(world: World) -> APIClient:
    return session_client(world.staff)


def patch_if_match(client: APIClient, url: str, data: dict[str, Any]) -> Any:
    """PATCH ``url`` with the ETag a GET just returned (the REST API's optimistic lock)."""
    etag = client.get(url)["ETag"]
    return client.patch(url, data, format="json", HTTP_IF_MATCH=etag)


def membership_of(user: Any, tenant: Tenant) -> Membership:
    return Membership.objects.get(user=user, tenant=tenant)
