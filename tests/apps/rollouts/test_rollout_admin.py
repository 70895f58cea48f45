"""The rollout admin creates through rollout_create (refusals are form errors), cancels
through rollout_cancel, and never edits a rollout or its events."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import rollout_create

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.fixture
def form(llm, stable, candidate):
    return {
        "model": llm.pk,
        "stable_version": stable.pk,
        "candidate_version": candidate.pk,
        "mode": "canary",
        "steps": json.dumps([1, 10, 100]),
        "max_error_rate_delta": "0.01",
        "max_ttft_p95_ratio": "1.2",
        "max_itl_p95_ratio": "1.2",
        "max_cost_ratio": "1.1",
        "step_window_s": "300",
        "min_samples": "200",
        "max_step_increase": "100",
        "excluded_tenants": "[]",
        "sticky_header": "",
    }


def test_pages_render(admin_client):
    assert admin_client.get(reverse("admin:rollouts_rollout_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:rollouts_rollout_add")).status_code == 200
    assert admin_client.get(reverse("admin:rollouts_rolloutevent_changelist")).status_code == 200


def test_add_goes_through_the_service(admin_client, admin_user, form):
    response = admin_client.post(reverse("admin:rollouts_rollout_add"), form)

    assert response.status_code == 302
    rollout = Rollout.objects.get()
    assert rollout.steps == [1, 10, 100]
    assert rollout.created_by == admin_user
    event = RolloutEvent.objects.get(rollout=rollout)
    assert (event.kind, event.actor_label) == ("created", admin_user.username)


def test_second_active_rollout_is_a_form_error(admin_client, form, llm, stable, candidate):
    first = rollout_create(
        actor=None, model=llm, stable_version=stable, candidate_version=candidate, mode="canary"
    )
    response = admin_client.post(reverse("admin:rollouts_rollout_add"), form)

    assert response.status_code == 200
    assert f"already has an active rollout (#{first.pk}, pending" in response.content.decode()
    assert Rollout.objects.count() == 1


def test_bad_steps_are_a_form_error(admin_client, form):
    response = admin_client.post(
        reverse("admin:rollouts_rollout_add"), {**form, "steps": json.dumps([1, 50])}
    )
    assert response.status_code == 200
    assert "Canary steps must end at 100." in response.content.decode()
    assert not Rollout.objects.exists()


def test_same_versions_are_a_form_error(admin_client, form, stable):
    response = admin_client.post(
        reverse("admin:rollouts_rollout_add"), {**form, "candidate_version": stable.pk}
    )
    assert response.status_code == 200
    assert "The candidate must differ from the stable version." in response.content.decode()


def test_a_rollout_is_view_only_and_cancelled_by_the_action(admin_client, admin_user, form):
    admin_client.post(reverse("admin:rollouts_rollout_add"), form)
    rollout = Rollout.objects.get()
    url = reverse("admin:rollouts_rollout_change", args=[rollout.pk])
    assert admin_client.get(url).status_code == 200
    assert admin_client.post(url, {**form, "mode": "ab"}).status_code == 403

    response = admin_client.post(
        reverse("admin:rollouts_rollout_changelist"),
        {"action": "cancel_selected", "_selected_action": [rollout.pk]},
    )
    assert response.status_code == 302
    rollout.refresh_from_db()
    assert rollout.state == "cancelled"
    event = RolloutEvent.objects.get(rollout=rollout, kind="cancelled")
    assert event.reason == f"Cancelled in the admin by {admin_user.username}."


def test_rollout_events_are_read_only(admin_client, llm, stable, candidate):
    rollout = rollout_create(
        actor=None, model=llm, stable_version=stable, candidate_version=candidate, mode="canary"
    )
    event = RolloutEvent.objects.get(rollout=rollout)
    url = reverse("admin:rollouts_rolloutevent_change", args=[event.pk])

    assert admin_client.get(url).status_code == 200  # view only
    assert admin_client.post(url, {"kind": "promoted"}).status_code == 403
    assert admin_client.get(reverse("admin:rollouts_rolloutevent_add")).status_code == 403
    delete = reverse("admin:rollouts_rolloutevent_delete", args=[event.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    event.refresh_from_db()
    assert event.kind == "created"
