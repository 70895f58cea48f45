"""Operator endpoints: happy paths, the services' refusals, ETag/If-Match and immutability."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from apps.common.models import AuditEvent
from apps.models.models import ModelVersion
from apps.tenants.models import Tenant
from config.celery import app
from runtime.artifacts import manifest_digest
from tests.api.conftest import LIMITS, World, manifest, patch_if_match

pytestmark = pytest.mark.db

OPS = "/api/v1/ops"


def test_tenants_create_list_get_update(world: World, staff_client: APIClient) -> None:
    created = staff_client.post(
        f"{OPS}/tenants/",
        {
            "slug": "initech",
            "name": "Initech",
            **LIMITS,
            "allowed_classes": ["batch"],
            "default_class": "batch",
            "allowed_models": ["tiny-llama"],
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["allowed_models"] == ["tiny-llama"]
    listed = staff_client.get(f"{OPS}/tenants/?status=active").json()["results"]
    assert [t["slug"] for t in listed] == ["initech", "globex", "acme"]
    url = f"{OPS}/tenants/initech/"
    data = {"rpm_limit": 10, "allowed_classes": ["batch", "standard"]}
    changed = patch_if_match(staff_client, url, data)
    assert changed.status_code == 200, changed.content
    assert changed.json()["rpm_limit"] == 10
    assert Tenant.objects.get(slug="initech").rpm_limit == 10


def test_tenant_refusals_carry_the_service_message(world: World, staff_client: APIClient) -> None:
    dup = staff_client.post(
        f"{OPS}/tenants/", {"slug": "acme", "name": "Again", **LIMITS}, format="json"
    )
    assert dup.status_code == 400
    assert dup.json()["error"]["fields"] == {"slug": ["A tenant with slug 'acme' already exists."]}
    bad = staff_client.post(
        f"{OPS}/tenants/",
        {"slug": "Bad Slug", "name": "x", **LIMITS, "rpm_limit": 0},
        format="json",
    )
    fields = bad.json()["error"]["fields"]
    assert fields["rpm_limit"] == [
        "Requests-per-minute limit must be a positive whole number (got 0)."
    ]
    assert fields["slug"][0].startswith("Slug must be 1-63 lower-case letters")
    unknown = patch_if_match(staff_client, f"{OPS}/tenants/acme/", {"allowed_classes": ["gold"]})
    assert unknown.json()["error"]["fields"] == {
        "allowed_classes": ["Unknown request class 'gold'."]
    }
    assert staff_client.get(f"{OPS}/tenants/nobody/").status_code == 404


def test_if_match_is_required_and_a_stale_write_is_refused(
    world: World, staff_client: APIClient
) -> None:
    url = f"{OPS}/tenants/acme/"
    first = staff_client.get(url)
    etag = first["ETag"]
    missing = staff_client.patch(url, {"weight": 2.0}, format="json")
    assert missing.status_code == 428
    assert missing.json()["error"]["code"] == "precondition_required"
    ok = staff_client.patch(url, {"weight": 2.0}, format="json", HTTP_IF_MATCH=etag)
    assert ok.status_code == 200
    # A second operator still holding the first read loses, and nothing changes.
    stale = staff_client.patch(url, {"weight": 3.0}, format="json", HTTP_IF_MATCH=etag)
    assert stale.status_code == 412
    assert Tenant.objects.get(slug="acme").weight == 2.0
    assert ok["ETag"] == staff_client.get(url)["ETag"]


def test_operator_issues_a_first_owner_token(world: World, staff_client: APIClient) -> None:
    issued = staff_client.post(
        f"{OPS}/tenants/globex/tokens/", {"name": "bootstrap", "role": "owner"}, format="json"
    )
    assert issued.status_code == 201, issued.content
    owner = APIClient()
    owner.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.json()['token']}")
    assert owner.get("/api/v1/tenants/globex/tokens/").status_code == 200
    assert owner.get("/api/v1/tenants/acme/").status_code == 404
    bad = staff_client.post(
        f"{OPS}/tenants/globex/tokens/", {"name": "x", "role": "god"}, format="json"
    )
    assert bad.status_code == 400


def test_suspend_and_activate(world: World, staff_client: APIClient) -> None:
    assert staff_client.post(f"{OPS}/tenants/globex/suspend/").json()["status"] == "suspended"
    twice = staff_client.post(f"{OPS}/tenants/globex/suspend/")
    assert twice.json()["error"]["fields"] == {"status": ["Tenant 'globex' is already suspended."]}
    assert staff_client.post(f"{OPS}/tenants/globex/activate/").json()["status"] == "active"


def test_classes(world: World, staff_client: APIClient) -> None:
    body = {
        "name": "gold",
        "priority_band": 0,
        "ttft_slo_ms": 100,
        "deadline_ms": 1000,
        "max_queue_length": 10,
        "shed_order": 9,
    }
    assert staff_client.post(f"{OPS}/classes/", body, format="json").status_code == 201
    bad = staff_client.post(
        f"{OPS}/classes/", {**body, "name": "gold2", "deadline_ms": 50}, format="json"
    )
    assert bad.json()["error"]["fields"] == {
        "deadline_ms": ["Deadline (50 ms) must not be shorter than the TTFT SLO (100 ms)."]
    }
    created = staff_client.get(f"{OPS}/classes/gold/").json()
    assert (created["heartbeat_ms"], created["itl_slo_ms"]) == (5000, 200)  # the defaults
    tuned = patch_if_match(
        staff_client, f"{OPS}/classes/gold/", {"heartbeat_ms": 0, "itl_slo_ms": 50}
    )
    assert (tuned.json()["heartbeat_ms"], tuned.json()["itl_slo_ms"]) == (0, 50)
    slow = patch_if_match(staff_client, f"{OPS}/classes/gold/", {"heartbeat_ms": 30_000})
    assert slow.json()["error"]["fields"] == {
        "heartbeat_ms": ["Heartbeat ms must be at most 5000 (got 30000)."]
    }
    renamed = patch_if_match(staff_client, f"{OPS}/classes/gold/", {"name": "platinum"})
    assert renamed.status_code == 200, renamed.content
    assert renamed.json()["name"] == "platinum"
    assert staff_client.get(f"{OPS}/classes/gold/").status_code == 404


def _version_body(label: str) -> dict[str, Any]:
    return {
        "label": label,
        "artifact_uri": f"file:///m/{label}",
        "digest": manifest_digest(manifest()["files"]),
        "manifest": manifest(),
        "runtime": "vllm",
    }


def test_models_and_versions_published_is_immutable(world: World, staff_client: APIClient) -> None:
    created = staff_client.post(
        f"{OPS}/models/", {"name": "embedder", "task": "embedding"}, format="json"
    )
    assert created.status_code == 201
    model_id = created.json()["id"]
    dup = staff_client.post(f"{OPS}/models/", {"name": "embedder", "task": "chat"}, format="json")
    assert dup.json()["error"]["fields"] == {"name": ["A model named 'embedder' already exists."]}
    described = patch_if_match(staff_client, f"{OPS}/models/{model_id}/", {"description": "d"})
    assert described.status_code == 200
    version = staff_client.post(
        f"{OPS}/models/{model_id}/versions/", _version_body("v1"), format="json"
    )
    assert version.status_code == 201, version.content
    vid = version.json()["id"]
    draft_edit = patch_if_match(staff_client, f"{OPS}/versions/{vid}/", {"memory_gb": 2.5})
    assert draft_edit.status_code == 200
    assert draft_edit.json()["memory_gb"] == 2.5
    published = staff_client.post(f"{OPS}/versions/{vid}/publish/")
    assert published.status_code == 200
    assert published.json()["published"] is True
    refused = patch_if_match(staff_client, f"{OPS}/versions/{vid}/", {"memory_gb": 4.0})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "immutable"
    assert "is published and immutable" in refused.json()["error"]["message"]
    assert ModelVersion.objects.get(pk=vid).memory_gb == 2.5
    again = staff_client.post(f"{OPS}/versions/{vid}/publish/")
    assert again.status_code == 400
    listed = staff_client.get(f"{OPS}/models/{model_id}/versions/").json()["results"]
    assert [v["label"] for v in listed] == ["v1"]


def test_pools_endpoints_routes_prices(world: World, staff_client: APIClient) -> None:
    pool = staff_client.post(
        f"{OPS}/pools/",
        {"name": "gpu", "hardware_tier": "h100", "cost_per_replica_hour": "3.5", "max_replicas": 2},
        format="json",
    )
    assert pool.status_code == 201, pool.content
    pool_url = f"{OPS}/pools/{pool.json()['id']}/"
    bad_pool = patch_if_match(staff_client, pool_url, {"min_replicas": 5})
    assert bad_pool.json()["error"]["fields"] == {
        "min_replicas": ["Minimum replicas must not exceed maximum replicas."]
    }
    endpoint = staff_client.post(
        f"{OPS}/endpoints/",
        {
            "pool": pool.json()["id"],
            "version": world.version.pk,
            "base_url": "http://10.0.0.5:8000",
        },
        format="json",
    )
    assert endpoint.status_code == 201, endpoint.content
    eid = endpoint.json()["id"]
    assert (
        patch_if_match(staff_client, f"{OPS}/endpoints/{eid}/", {"state": "ready"}).json()["state"]
        == "ready"
    )
    bad = patch_if_match(staff_client, f"{OPS}/endpoints/{eid}/", {"state": "starting"})
    assert bad.json()["error"]["fields"]["state"][0].startswith("An endpoint cannot go from ready")
    assert len(staff_client.get(f"{OPS}/endpoints/?state=ready").json()["results"]) == 1
    route_url = f"{OPS}/routes/{world.model.pk}/"
    assert staff_client.get(route_url).json()["splits"] == [
        {"version": world.version.pk, "weight": 1}
    ]
    put = staff_client.put(
        route_url, {"splits": [{"version": world.version.pk, "weight": 5}]}, format="json"
    )
    assert put.status_code == 200
    assert put.json()["splits"][0]["weight"] == 5
    stale = staff_client.put(
        route_url,
        {"splits": [{"version": world.version.pk, "weight": 7}]},
        format="json",
        HTTP_IF_MATCH='"stale"',
    )
    assert stale.status_code == 412
    unknown = staff_client.put(
        route_url, {"splits": [{"version": 999999, "weight": 1}]}, format="json"
    )
    assert unknown.json()["error"]["fields"] == {"splits": ["Unknown version id(s): 999999."]}
    assert len(staff_client.get(f"{OPS}/routes/").json()["results"]) == 1
    price = staff_client.post(
        f"{OPS}/prices/",
        {
            "version": world.version.pk,
            "hardware_tier": "h100",
            "input_per_1k": "0.5",
            "output_per_1k": "1.5",
        },
        format="json",
    )
    assert price.status_code == 200, price.content
    assert price.json()["cache_hit_discount"] == "0.500"
    assert price.json()["batch_discount"] == "0.000"
    h100 = {"version": world.version.pk, "hardware_tier": "h100", "input_per_1k": "0.5",
            "output_per_1k": "1.5"}  # fmt: skip
    for discount, status, found in (("0.5", 200, "0.500"), ("1.5", 400, None)):
        answer = staff_client.post(f"{OPS}/prices/", {**h100, "batch_discount": discount},
                                   format="json")  # fmt: skip
        assert answer.status_code == status
        if found is None:
            assert "batch_discount" in answer.json()["error"]["fields"]
        else:
            assert answer.json()["batch_discount"] == found
    bad_price = staff_client.post(
        f"{OPS}/prices/",
        {
            "version": world.version.pk,
            "hardware_tier": "H 100",
            "input_per_1k": "1",
            "output_per_1k": "1",
        },
        format="json",
    )
    assert "hardware_tier" in bad_price.json()["error"]["fields"]
    assert len(staff_client.get(f"{OPS}/prices/").json()["results"]) == 2


def test_grants_and_budgets(world: World, staff_client: APIClient) -> None:
    grant = staff_client.post(
        f"{OPS}/tenants/acme/grants/", {"amount": "25", "reason": "promo"}, format="json"
    )
    assert grant.status_code == 201
    assert grant.json()["balance"] == "75.000000"
    overdraw = staff_client.post(
        f"{OPS}/tenants/acme/grants/", {"amount": "-100", "reason": "oops"}, format="json"
    )
    assert overdraw.status_code == 400
    assert "may not go below 0" in overdraw.json()["error"]["fields"]["amount"][0]
    budget = staff_client.put(
        f"{OPS}/tenants/acme/budgets/month/",
        {"soft_alert_pct": 90, "hard_cap": "1000"},
        format="json",
    )
    assert budget.status_code == 200
    bad = staff_client.put(
        f"{OPS}/tenants/acme/budgets/week/",
        {"soft_alert_pct": 90, "hard_cap": "1000"},
        format="json",
    )
    assert "period" in bad.json()["error"]["fields"]


def test_rollouts_create_get_cancel(world: World, staff_client: APIClient) -> None:
    v2 = staff_client.post(
        f"{OPS}/models/{world.model.pk}/versions/", _version_body("v2"), format="json"
    ).json()["id"]
    body = {"model": world.model.pk, "stable_version": world.version.pk, "candidate_version": v2}
    draft = staff_client.post(f"{OPS}/rollouts/", body, format="json")
    assert draft.json()["error"]["fields"] == {
        "candidate_version": ["Version tiny-llama:v2 is not published."]
    }
    staff_client.post(f"{OPS}/versions/{v2}/publish/")
    created = staff_client.post(f"{OPS}/rollouts/", body, format="json")
    assert created.status_code == 201, created.content
    rid = created.json()["id"]
    assert created.json()["events"][0]["kind"] == "created"
    assert staff_client.post(f"{OPS}/rollouts/", body, format="json").status_code == 400
    assert staff_client.get(f"{OPS}/rollouts/?state=pending").json()["results"][0]["id"] == rid
    no_reason = staff_client.post(f"{OPS}/rollouts/{rid}/cancel/", {"reason": " "}, format="json")
    assert no_reason.json()["error"]["fields"] == {"reason": ["Say why the rollout is cancelled."]}
    cancelled = staff_client.post(f"{OPS}/rollouts/{rid}/cancel/", {"reason": "bad"}, format="json")
    assert cancelled.json()["state"] == "cancelled"
    assert staff_client.get(f"{OPS}/rollouts/{rid}/").json()["events"][-1]["kind"] == "cancelled"


def test_snapshot_refresh_is_queued_with_a_task_id(world: World, staff_client: APIClient) -> None:
    response = staff_client.post(f"{OPS}/snapshot/refresh/")
    assert response.status_code == 202, response.content
    task_id = response.json()["task_id"]
    assert response.json()["status_url"].endswith(f"/api/v1/ops/tasks/{task_id}/")
    try:
        # No worker runs in this test: the task waits in the broker (Redis), state PENDING.
        queued = staff_client.get(f"{OPS}/tasks/{task_id}/").json()
        assert queued == {"task_id": task_id, "state": "PENDING", "result": None, "error": None}
        # What a worker would record, through Celery's own result backend.
        app.backend.store_result(task_id, 42, "SUCCESS")
        done = staff_client.get(f"{OPS}/tasks/{task_id}/").json()
        assert (done["state"], done["result"]) == ("SUCCESS", 42)
        app.backend.store_result(f"{task_id}-2", ValueError("boom"), "FAILURE")
        failed = staff_client.get(f"{OPS}/tasks/{task_id}-2/").json()
        assert failed["state"] == "FAILURE"
        assert "boom" in failed["error"]
    finally:
        app.backend.forget(task_id)
        app.backend.forget(f"{task_id}-2")
        app.control.purge()


def test_audit_log_filters(world: World, staff_client: APIClient) -> None:
    staff_client.post(f"{OPS}/tenants/acme/suspend/")
    events = staff_client.get(f"{OPS}/audit/?action=tenant.suspend").json()["results"]
    assert [(e["action"], e["actor_label"]) for e in events] == [("tenant.suspend", "operator")]
    by_type = staff_client.get(f"{OPS}/audit/?target_type=tenants.managementtoken").json()
    assert len(by_type["results"]) == 6
    by_actor = staff_client.get(f"{OPS}/audit/?actor=operator").json()["results"]
    assert len(by_actor) == 1
    assert AuditEvent.objects.count() > 20
    page = staff_client.get(f"{OPS}/audit/?page_size=5").json()
    assert len(page["results"]) == 5
    assert page["next"]


@pytest.mark.parametrize("path", ["/api/schema/", "/api/docs/"])
def test_schema_and_docs_are_served(world: World, path: str) -> None:
    response = APIClient().get(path)
    assert response.status_code == 200
    if path == "/api/docs/":
        html = response.content.decode()
        assert "swagger-ui" in html
        assert "cdn" not in html.lower()
        assert "/static/drf_spectacular_sidecar/" in html


def test_issue_management_token_command(world: World) -> None:
    out = StringIO()
    call_command("issue_management_token", "acme", "--role", "viewer", stdout=out)
    token = out.getvalue().strip()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/tenants/acme/").json()["role"] == "viewer"
    with pytest.raises(CommandError, match="no tenant with slug 'nobody'"):
        call_command("issue_management_token", "nobody")
