"""Dashboard fixtures: a unique live namespace, users with and without tenants, sessions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.db import connections
from fixtures.router import redis_url

from apps.models.services import model_create, model_version_create, model_version_publish
from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_create
from apps.tenants.models import Membership, Tenant
from frontend.control_feed import control_key, tasks_key
from runtime.artifacts import manifest_digest
from runtime.telemetry.live import live_backlog

FILES = {"model.safetensors": "cd" * 32}


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_persistent_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consumers query from Channels' worker thread; a kept-open connection there would
    block dropping the test database."""
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)


@pytest.fixture
def namespace(settings: Any) -> Iterator[str]:
    """The control plane reads live documents from a namespace of this test's own."""
    ns = f"switchyard:test:dash:{uuid.uuid4().hex[:10]}"
    settings.SNAPSHOT_REDIS_PREFIX = f"{ns}:snapshot"
    yield ns
    client = redis.Redis.from_url(redis_url())
    client.delete(live_backlog(ns), f"{ns}:live:relay", control_key(ns), tasks_key(ns))
    client.close()


def make_tenant(slug: str) -> Tenant:
    return Tenant.objects.create(
        slug=slug,
        name=slug.title(),
        rpm_limit=60,
        tpm_limit=10_000,
        max_concurrency=4,
        max_context_tokens=4096,
        max_output_tokens=256,
    )


@pytest.fixture
def people(transactional_db: Any) -> dict[str, User]:
    """staff; alice (member of acme); bob (member of globex); nobody (no tenant)."""
    acme, globex = make_tenant("acme"), make_tenant("globex")
    users = {
        "staff": User.objects.create_user("staff", password="pw-staff", is_staff=True),
        "alice": User.objects.create_user("alice", password="pw-alice"),
        "bob": User.objects.create_user("bob", password="pw-bob"),
        "nobody": User.objects.create_user("nobody", password="pw-nobody"),
    }
    Membership.objects.create(user=users["alice"], tenant=acme, role="viewer")
    Membership.objects.create(user=users["bob"], tenant=globex, role="owner")
    return users


@pytest.fixture
def rollout(people: dict[str, User], namespace: str) -> Rollout:
    """A canary draft of tiny-llama v1 -> v2 (both published)."""
    model = model_create(actor=None, name="tiny-llama", task="chat")
    versions = []
    for label in ("v1", "v2"):
        version = model_version_create(
            actor=None,
            model=model,
            label=label,
            artifact_uri=f"file:///m/{label}",
            digest=manifest_digest(FILES),
            manifest={
                "tokenizer": "tok",
                "max_context": 2048,
                "default_sampling": {},
                "files": FILES,
            },
            runtime="vllm",
        )
        versions.append(model_version_publish(actor=None, version=version))
    return rollout_create(
        actor=people["staff"],
        model=model,
        stable_version=versions[0],
        candidate_version=versions[1],
        mode="canary",
    )
