"""Fixtures for billing: a tenant, a published version, snapshot-publish tracking."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from apps.models.models import ModelVersion
from apps.models.services import model_create, model_version_create, model_version_publish
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create
from runtime.artifacts import manifest_digest


def make_tenant(slug: str) -> Tenant:
    return tenant_create(
        actor=None,
        slug=slug,
        name=slug.title(),
        rpm_limit=600,
        tpm_limit=100_000,
        max_concurrency=8,
        max_context_tokens=8192,
        max_output_tokens=1024,
    )


@pytest.fixture
def tenant(db: Any) -> Tenant:
    return make_tenant("acme")


@pytest.fixture
def other_tenant(db: Any) -> Tenant:
    return make_tenant("globex")


@pytest.fixture
def version(db: Any) -> ModelVersion:
    model = model_create(actor=None, name="tiny-llama", task="chat")
    files = {"model.safetensors": "cd" * 32}
    draft = model_version_create(
        actor=None,
        model=model,
        label="v1",
        artifact_uri="file:///models/tiny-llama/v1",
        digest=manifest_digest(files),
        manifest={"tokenizer": "tok", "max_context": 2048, "default_sampling": {}, "files": files},
        runtime="vllm",
    )
    return model_version_publish(actor=None, version=draft)


@pytest.fixture(autouse=True)
def billing_namespace(settings: Any) -> Iterator[str]:
    """A private Redis key namespace (balances, escrow, the usage stream), removed after."""
    namespace = f"switchyard:test:billing:{uuid.uuid4().hex[:10]}"
    settings.SNAPSHOT_REDIS_PREFIX = f"{namespace}:snapshot"
    yield namespace
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def rclient(settings: Any) -> Iterator[redis.Redis[bytes]]:
    client: redis.Redis[bytes] = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()
