"""Fixtures for billing: a tenant, a published version, snapshot-publish tracking."""

from __future__ import annotations

from typing import Any

import pytest
from fixtures.redis_keys import RouterNamespace

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
def billing_namespace(router_namespace: RouterNamespace) -> str:
    """A private Redis key namespace (balances, escrow, the usage stream), removed after."""
    return router_namespace.name
