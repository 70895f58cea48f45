"""The result cache's registry side: the policy in the snapshot, and the audited purge."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from fixtures.redis_keys import RouterNamespace

from apps.common.models import AuditEvent
from apps.core.selectors import snapshot_build
from apps.models.models import Model, ModelVersion
from apps.models.services.cache import cache_purge_run, version_tag
from apps.tenants.models import Tenant
from apps.tenants.services.tenants import tenant_create
from runtime.artifacts import manifest_digest
from runtime.contract import cache_entry_key, cache_index_keys

pytestmark = pytest.mark.db


@pytest.fixture
def namespace(router_namespace: RouterNamespace) -> str:
    return router_namespace.name


def _manifest(files: dict[str, str]) -> dict[str, Any]:
    return {"tokenizer": "t", "max_context": 2048, "default_sampling": {}, "files": files}


def _tenant(slug: str) -> Tenant:
    return tenant_create(
        actor=None, slug=slug, name=slug.title(), rpm_limit=10, tpm_limit=1000,
        max_concurrency=2, max_context_tokens=100, max_output_tokens=10,
    )  # fmt: skip


@pytest.mark.db
@pytest.mark.django_db
def test_snapshot_carries_the_cache_policy_and_opt_out(
    make_version: Callable[..., ModelVersion], llm: Model
) -> None:
    make_version("v1", publish=True)
    Model.objects.filter(pk=llm.pk).update(cache_enabled=False, cache_shared=True, cache_ttl_s=60)
    tenant = _tenant("quiet")
    Tenant.objects.filter(pk=tenant.pk).update(result_cache=False)
    snapshot = snapshot_build()
    policy = snapshot.models["tiny-llama"].cache
    assert (policy.enabled, policy.shared, policy.ttl_s) == (False, True, 60)
    assert snapshot.tenants["quiet"].result_cache is False


@pytest.mark.db
@pytest.mark.django_db
def test_purge_by_tenant_and_by_version_is_audited(
    make_version: Callable[..., ModelVersion], namespace: str
) -> None:
    v1 = make_version("v1", publish=True)
    files = {"model.safetensors": "ab" * 32}
    v2 = make_version("v2", publish=True, manifest=_manifest(files),
                      digest=manifest_digest(files))  # fmt: skip
    acme, beta = _tenant("acme"), _tenant("beta")
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    keys = {
        (t, v): cache_entry_key(namespace, t, version_tag(v), uuid.uuid4().hex)
        for t in ("acme", "beta") for v in (v1, v2)
    }  # fmt: skip
    for (tenant, _), key in keys.items():
        client.set(key, b"x")
        client.zadd(cache_index_keys(namespace, tenant)[0], {key: 1})
    assert cache_purge_run(actor=None, tenant=acme) == 2
    assert client.exists(keys["acme", v1], keys["acme", v2]) == 0
    assert client.zcard(cache_index_keys(namespace, "acme")[0]) == 0
    assert client.exists(keys["beta", v1], keys["beta", v2]) == 2
    call_command("cache_purge", "--model-version", f"tiny-llama:{v2.label}")
    assert client.exists(keys["beta", v1]) == 1
    assert client.exists(keys["beta", v2]) == 0
    client.close()
    events = AuditEvent.objects.filter(action="cache.purge").order_by("id")
    assert [e.after["removed"] for e in events] == [2, 1]
    assert events[0].target_id == str(acme.pk)
    assert beta.slug == "beta"


@pytest.mark.db
@pytest.mark.django_db
def test_purge_command_refuses_unknown_names(namespace: str) -> None:
    with pytest.raises(CommandError, match="no tenant"):
        call_command("cache_purge", "--tenant", "nobody")
    with pytest.raises(CommandError, match="no model version"):
        call_command("cache_purge", "--model-version", "x:y")
    with pytest.raises(CommandError, match="name --tenant"):
        call_command("cache_purge")
