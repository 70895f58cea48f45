"""The REST lists of Batch API batches: operators see every tenant's (filtered by tenant and
status, cursor-paginated), a tenant's members their own, each with its progress."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.batches.models import Batch
from apps.tenants.models import Tenant
from tests.api.conftest import World, session_client, token_client

pytestmark = [pytest.mark.db, pytest.mark.django_db]

OPS = "/api/v1/ops/batches/"


def _batch(tenant: Tenant, name: str, status: str, *, total: int, completed: int,
           failed: int = 0) -> Batch:  # fmt: skip
    return Batch.objects.create(
        public_id=name, tenant=tenant, endpoint="/v1/chat/completions", status=status,
        total=total, completed=completed, failed=failed,
        expires_at=timezone.now() + timedelta(hours=24),
    )  # fmt: skip


@pytest.fixture
def batches(world: World) -> dict[str, Batch]:
    return {
        "a1": _batch(world.a.tenant, "batch_a1", "completed", total=4, completed=3, failed=1),
        "a2": _batch(world.a.tenant, "batch_a2", "in_progress", total=8, completed=2),
        "b1": _batch(world.b.tenant, "batch_b1", "in_progress", total=10, completed=0),
    }


def _ids(resp: Any) -> list[str]:
    assert resp.status_code == 200, resp.content
    return [row["id"] for row in resp.json()["results"]]


def test_operators_list_every_tenants_batches_with_progress(
    staff_client: APIClient, batches: dict[str, Batch]
) -> None:
    assert _ids(staff_client.get(OPS)) == ["batch_b1", "batch_a2", "batch_a1"]  # newest first
    running = staff_client.get(OPS, {"tenant": "acme", "status": "in_progress"})
    (row,) = running.json()["results"]
    assert (row["id"], row["tenant"], row["status"]) == ("batch_a2", "acme", "in_progress")
    assert row["request_counts"] == {"total": 8, "completed": 2, "failed": 0}
    assert row["progress"] == 0.25
    assert row["created_at"] < row["expires_at"]
    done = staff_client.get(OPS, {"status": "completed"}).json()["results"][0]
    assert done["progress"] == 1.0  # 3 answered + 1 failed of 4
    assert _ids(staff_client.get(OPS, {"tenant": "nobody"})) == []


def test_the_operator_list_pages_with_a_cursor(
    staff_client: APIClient, batches: dict[str, Batch]
) -> None:
    first = staff_client.get(OPS, {"page_size": 2}).json()
    assert [r["id"] for r in first["results"]] == ["batch_b1", "batch_a2"]
    rest = staff_client.get(first["next"]).json()
    assert [r["id"] for r in rest["results"]] == ["batch_a1"]
    assert rest["next"] is None


def test_a_bad_status_filter_is_a_400(staff_client: APIClient, batches: dict[str, Batch]) -> None:
    resp = staff_client.get(OPS, {"status": "done"})
    assert resp.status_code == 400
    assert "status" in resp.json()["error"]["fields"]


def test_members_list_their_own_tenants_batches_only(
    world: World, batches: dict[str, Batch]
) -> None:
    viewer = session_client(world.a.users["viewer"])
    assert _ids(viewer.get("/api/v1/tenants/acme/batches/")) == ["batch_a2", "batch_a1"]
    token = token_client(world.a.tokens["viewer"][1])
    assert _ids(token.get("/api/v1/tenants/acme/batches/", {"status": "completed"})) == ["batch_a1"]
    assert viewer.get("/api/v1/tenants/globex/batches/").status_code in (403, 404)
    assert viewer.get(OPS).status_code in (401, 403)
