"""The operator scaling endpoints: a pool's settings (read, update under If-Match, refusals
with the service's messages) and its autoscaler decisions, newest first, by cursor."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.common.models import AuditEvent
from apps.models.services import model_version_create, pool_create
from apps.scaling.actuators.base import Actuation
from apps.scaling.services import scaling_decision_record
from runtime.scaling.controller import Plan
from runtime.scaling.signals import PoolSignals
from tests.api.conftest import World, patch_if_match

pytestmark = pytest.mark.db

OPS = "/api/v1/ops"


def test_settings_read_with_defaults_and_update(world: World, staff_client: APIClient) -> None:
    url = f"{OPS}/pools/{world.pool.pk}/scaling/"
    read = staff_client.get(url)
    assert read.status_code == 200, read.content
    assert read["ETag"]
    body = read.json()
    assert (body["pool"], body["enabled"], body["policy"]) == (world.pool.pk, True, "")
    assert (body["target_low"], body["target_high"], body["idle_to_zero_s"]) == (0.4, 0.8, 300.0)
    changed = patch_if_match(
        staff_client, url, {"policy": "cpu", "target_low": 0.5, "idle_to_zero_s": None}
    )
    assert changed.status_code == 200, changed.content
    assert changed["ETag"] != read["ETag"]
    assert (changed.json()["policy"], changed.json()["target_low"]) == ("cpu", 0.5)
    assert changed.json()["idle_to_zero_s"] is None
    assert staff_client.get(url).json() == changed.json()
    world.pool.scaling.refresh_from_db()
    assert world.pool.scaling.policy == "cpu"


def test_refusals_carry_the_service_message(world: World, staff_client: APIClient) -> None:
    url = f"{OPS}/pools/{world.pool.pk}/scaling/"
    unknown = patch_if_match(staff_client, url, {"policy": "tpu"})
    assert unknown.status_code == 400, unknown.content
    assert unknown.json()["error"]["fields"] == {
        "policy": ["Unknown scaling policy 'tpu'; known: cpu, gpu (or blank)."]
    }
    negative = patch_if_match(staff_client, url, {"idle_to_zero_s": -1})
    assert negative.json()["error"]["fields"] == {
        "idle_to_zero_s": ["Give a non-negative number of seconds, or null (never)."]
    }
    band = patch_if_match(staff_client, url, {"target_low": 0.9})
    assert band.status_code == 400, band.content
    assert list(band.json()["error"]["fields"]) == ["non_field_errors"]
    below = patch_if_match(staff_client, url, {"wait_slo_s": 0})
    assert list(below.json()["error"]["fields"]) == ["wait_slo_s"]
    assert staff_client.get(url).json()["policy"] == ""  # nothing was written


def test_the_version_to_start_is_read_and_set(world: World, staff_client: APIClient) -> None:
    url = f"{OPS}/pools/{world.pool.pk}/scaling/"
    assert staff_client.get(url).json()["version"] is None
    changed = patch_if_match(staff_client, url, {"version": world.version.pk})
    assert changed.status_code == 200, changed.content
    assert changed.json()["version"] == world.version.pk
    world.pool.scaling.refresh_from_db()
    assert world.pool.scaling.version_id == world.version.pk
    event = AuditEvent.objects.filter(action="pool_scaling.update").latest("id")
    assert (event.before, event.after) == ({"version": None}, {"version": world.version.pk})
    draft = model_version_create(
        actor=None, model=world.version.model, label="draft",
        artifact_uri="file:///models/tiny-llama/draft", digest=world.version.digest,
        manifest=world.version.manifest, runtime="vllm",
    )  # fmt: skip
    refused = patch_if_match(staff_client, url, {"version": draft.pk})
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["fields"] == {
        "version": [f"Version {draft.pk} is not published; only a published version can run."]
    }
    missing = patch_if_match(staff_client, url, {"version": 987654})
    assert missing.status_code == 400, missing.content
    assert list(missing.json()["error"]["fields"]) == ["version"]
    cleared = patch_if_match(staff_client, url, {"version": None})
    assert cleared.status_code == 200, cleared.content
    assert cleared.json()["version"] is None


def test_updates_need_a_current_if_match(world: World, staff_client: APIClient) -> None:
    url = f"{OPS}/pools/{world.pool.pk}/scaling/"
    stale = staff_client.get(url)["ETag"]
    missing = staff_client.patch(url, {"enabled": False}, format="json")
    assert missing.status_code == 428, missing.content
    assert missing.json()["error"]["code"] == "precondition_required"
    assert patch_if_match(staff_client, url, {"enabled": False}).status_code == 200
    late = staff_client.patch(url, {"enabled": True}, format="json", HTTP_IF_MATCH=stale)
    assert late.status_code == 412, late.content
    assert late.json()["error"]["code"] == "precondition_failed"
    assert staff_client.get(url).json()["enabled"] is False


def _decide(world: World, action: str, current: int, desired: int, error: str = "") -> int:
    decision = scaling_decision_record(
        pool=world.pool, policy="cpu", actuator="local",
        plan=Plan(action, current, desired, f"test {action}"),  # type: ignore[arg-type]
        signals=PoolSignals(pool=world.pool.name, at=1.0, inflight=current),
        actuation=Actuation(started=max(desired - current, 0), error=error),
    )  # fmt: skip
    return decision.pk


def test_decisions_newest_first_by_cursor(world: World, staff_client: APIClient) -> None:
    ids = [_decide(world, "out", n, n + 1) for n in range(3)]
    failed = _decide(world, "in", 3, 2, error="cannot stop replica")
    url = f"{OPS}/pools/{world.pool.pk}/scaling/decisions/"
    first = staff_client.get(url, {"page_size": 2})
    assert first.status_code == 200, first.content
    page = first.json()
    assert [d["id"] for d in page["results"]] == [failed, ids[2]]
    top = page["results"][0]
    assert (top["action"], top["current"], top["desired"]) == ("in", 3, 2)
    assert (top["reason"], top["error"]) == ("test in", "cannot stop replica")
    assert top["signals"]["pool"] == world.pool.name
    second = staff_client.get(page["next"]).json()
    assert [d["id"] for d in second["results"]] == [ids[1], ids[0]]
    assert second["next"] is None


def test_unknown_pool_is_not_found(world: World, staff_client: APIClient) -> None:
    missing = world.pool.pk + 1000
    for url in (f"{OPS}/pools/{missing}/scaling/", f"{OPS}/pools/{missing}/scaling/decisions/"):
        response = staff_client.get(url)
        assert response.status_code == 404, (url, response.content)
        assert response.json()["error"]["code"] == "not_found"
    patch = staff_client.patch(
        f"{OPS}/pools/{missing}/scaling/", {"enabled": False}, format="json", HTTP_IF_MATCH="*"
    )
    assert patch.status_code == 404, patch.content


def test_decisions_of_another_pool_are_not_listed(world: World, staff_client: APIClient) -> None:
    other = pool_create(actor=None, name="other", hardware_tier="cpu", cost_per_replica_hour="1")
    _decide(world, "hold", 1, 1)
    listed = staff_client.get(f"{OPS}/pools/{other.pk}/scaling/decisions/").json()
    assert listed["results"] == []


def test_a_settings_change_is_audited_with_its_actor(world: World, staff_client: APIClient) -> None:
    url = f"{OPS}/pools/{world.pool.pk}/scaling/"
    assert patch_if_match(staff_client, url, {"policy": "gpu"}).status_code == 200
    event = AuditEvent.objects.filter(action="pool_scaling.update").latest("id")
    assert event.actor_id is not None
    assert (event.before, event.after) == ({"policy": ""}, {"policy": "gpu"})
