"""Registry service for the result cache: purging cached results (audited).

The entries live in Redis (runtime/cache); a purge deletes them and tells every router to drop
its in-process copies (:func:`runtime.cache.purge.cache_purge`).
"""

from __future__ import annotations

import redis
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError

from apps.common.audit import audit_record
from apps.models.models import ModelVersion
from apps.tenants.models import Tenant
from runtime import redis_conn
from runtime.cache.purge import cache_purge
from runtime.contract import namespace_of


def version_tag(version: ModelVersion) -> str:
    """The name of a version in cache keys (as :func:`runtime.cache.policy.version_tag`)."""
    return version.digest or f"id{version.pk}"


def cache_purge_run(
    *,
    actor: AbstractBaseUser | None,
    tenant: Tenant | None = None,
    version: ModelVersion | None = None,
) -> int:
    """Delete the cached results of ``tenant`` and/or ``version`` (at least one); returns how
    many entries went. One audit event per purge, on the tenant (else the version)."""
    if tenant is None and version is None:
        raise ValidationError("Name a tenant or a model version to purge.")
    client: redis.Redis[bytes] = redis_conn.from_url(
        settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2
    )
    try:
        removed = cache_purge(
            client,
            namespace=namespace_of(settings.SNAPSHOT_REDIS_PREFIX),
            tenant=tenant.slug if tenant is not None else None,
            version=version_tag(version) if version is not None else None,
        )
    finally:
        client.close()
    target = tenant if tenant is not None else version
    assert target is not None
    audit_record(
        actor=actor,
        action="cache.purge",
        target=target,
        after={
            "tenant": tenant.slug if tenant is not None else None,
            "version": str(version) if version is not None else None,
            "removed": removed,
        },
    )
    return removed
