"""Fixtures for the tenants app: request classes, a tenant factory, snapshot-publish tracking."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fixtures.control_plane import LIMITS

from apps.tenants.models import RequestClass, Tenant
from apps.tenants.services import request_class_create, tenant_create


@pytest.fixture
def limits() -> dict[str, int]:
    """A valid set of the five tenant limits."""
    return dict(LIMITS)


@pytest.fixture
def classes(db: Any) -> dict[str, RequestClass]:
    """interactive / standard / batch."""
    specs = [
        ("interactive", 0, 500, 5_000, 100, 3),
        ("standard", 1, 2_000, 30_000, 500, 2),
        ("batch", 2, 60_000, 3_600_000, 10_000, 1),
    ]
    return {
        name: request_class_create(
            actor=None,
            name=name,
            priority_band=band,
            ttft_slo_ms=ttft,
            deadline_ms=deadline,
            max_queue_length=queue,
            shed_order=shed,
        )
        for name, band, ttft, deadline, queue, shed in specs
    }


@pytest.fixture
def make_tenant(classes: dict[str, RequestClass]) -> Callable[..., Tenant]:
    def make(slug: str = "acme", **overrides: Any) -> Tenant:
        values: dict[str, Any] = {
            "name": slug.title(),
            **LIMITS,
            "allowed_classes": [classes["interactive"], classes["standard"]],
            "default_class": classes["standard"],
            **overrides,
        }
        return tenant_create(actor=None, slug=slug, **values)

    return make


@pytest.fixture
def tenant(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant()
