"""The registry admin writes through the services and shows their refusals as form errors."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from apps.common.models import AuditEvent
from apps.models.models import Endpoint, Model, ModelVersion, Pool, Route
from apps.models.services import endpoint_register

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def version_form(llm, manifest, **overrides):
    return {
        "model": llm.pk,
        "label": "v2",
        "artifact_uri": "file:///models/tiny-llama/v2",
        "digest": "12" * 32,
        "manifest": json.dumps(manifest),
        "runtime": "vllm",
        "memory_gb": "1.5",
        "tensor_parallel_size": "1",
        **overrides,
    }


@pytest.mark.parametrize("name", ["model", "modelversion", "pool", "endpoint", "route"])
def test_changelists_and_add_pages_render(admin_client, name):
    assert admin_client.get(reverse(f"admin:registry_{name}_changelist")).status_code == 200
    assert admin_client.get(reverse(f"admin:registry_{name}_add")).status_code == 200


def test_editing_a_published_version_is_refused(admin_client, published):
    url = reverse("admin:registry_modelversion_change", args=[published.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    assert 'name="digest"' not in page.content.decode()  # read-only once published

    before = ModelVersion.objects.values().get(pk=published.pk)
    response = admin_client.post(url, {"digest": "0" * 64, "runtime": "simulator", "label": "v1"})

    assert response.status_code == 200  # the form again, with the service's message
    assert "is published and immutable" in response.content.decode()
    assert ModelVersion.objects.values().get(pk=published.pk) == before
    assert not AuditEvent.objects.filter(action="model_version.update").exists()


def test_adding_a_version_goes_through_the_service(admin_client, admin_user, llm, manifest):
    response = admin_client.post(
        reverse("admin:registry_modelversion_add"), version_form(llm, manifest)
    )

    assert response.status_code == 302
    version = ModelVersion.objects.get(label="v2")
    assert version.manifest == manifest
    event = AuditEvent.objects.get(action="model_version.create")
    assert event.actor_label == admin_user.username


def test_adding_a_version_with_a_bad_digest_and_manifest_shows_errors(admin_client, llm):
    form = version_form(llm, {"max_context": -1}, digest="XYZ")
    response = admin_client.post(reverse("admin:registry_modelversion_add"), form)

    assert response.status_code == 200
    content = response.content.decode()
    assert "Digest must be a sha256" in content
    assert "max_context" in content
    assert not ModelVersion.objects.exists()


def test_editing_a_draft_goes_through_the_service(admin_client, draft, manifest):
    url = reverse("admin:registry_modelversion_change", args=[draft.pk])
    form = version_form(draft.model, manifest, label="draft", runtime="simulator")
    response = admin_client.post(url, form)

    assert response.status_code == 302
    draft.refresh_from_db()
    assert draft.runtime == "simulator"
    assert AuditEvent.objects.get(action="model_version.update").after["runtime"] == "simulator"


def test_publish_action(admin_client, draft):
    response = admin_client.post(
        reverse("admin:registry_modelversion_changelist"),
        {"action": "publish_selected", "_selected_action": [draft.pk]},
    )
    assert response.status_code == 302
    draft.refresh_from_db()
    assert draft.is_published


def test_model_add_refuses_a_bad_name(admin_client):
    response = admin_client.post(
        reverse("admin:registry_model_add"), {"name": "bad name", "task": "chat"}
    )
    assert response.status_code == 200
    assert "Model name must be" in response.content.decode()
    assert not Model.objects.exists()


def test_pool_add_refuses_warm_above_max(admin_client):
    form = {
        "name": "gpu-a",
        "hardware_tier": "h100",
        "cost_per_replica_hour": "2",
        "min_replicas": "0",
        "max_replicas": "1",
        "warm_replicas": "3",
        "policies": "{}",
    }
    response = admin_client.post(reverse("admin:registry_pool_add"), form)
    assert response.status_code == 200
    assert "Warm replicas must lie between" in response.content.decode()
    assert not Pool.objects.exists()

    response = admin_client.post(reverse("admin:registry_pool_add"), {**form, "warm_replicas": "1"})
    assert response.status_code == 302
    assert AuditEvent.objects.filter(action="pool.create").exists()


def test_pool_add_shows_an_unknown_policy_as_a_field_error(admin_client):
    form = {
        "name": "gpu-a",
        "hardware_tier": "h100",
        "cost_per_replica_hour": "2",
        "min_replicas": "0",
        "max_replicas": "1",
        "warm_replicas": "0",
        "policies": '{"fairness": "vtcc"}',
    }
    response = admin_client.post(reverse("admin:registry_pool_add"), form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "unknown fairness policy" in " ".join(errors["policies"])
    assert not Pool.objects.exists()


def test_endpoint_bad_transition_is_a_form_error(admin_client, pool, published):
    endpoint = endpoint_register(
        actor=None, pool=pool, version=published, base_url="http://w:1", capacity=2
    )
    url = reverse("admin:registry_endpoint_change", args=[endpoint.pk])
    assert admin_client.post(url, {"state": "gone"}).status_code == 302

    response = admin_client.post(url, {"state": "ready"})
    assert response.status_code == 200
    assert "cannot go from gone to ready" in response.content.decode()
    assert Endpoint.objects.get(pk=endpoint.pk).state == "gone"


def test_endpoint_add_refuses_zero_capacity(admin_client, pool, published):
    form = {"pool": pool.pk, "version": published.pk, "base_url": "http://w:1", "capacity": "0"}
    response = admin_client.post(reverse("admin:registry_endpoint_add"), form)
    assert response.status_code == 200
    assert not Endpoint.objects.exists()


def test_route_add_refuses_weight_zero_then_saves(admin_client, llm, make_version):
    make_version("v1", publish=True)
    make_version("v2", publish=True)
    url = reverse("admin:registry_route_add")
    form = {"model": llm.pk, "sticky_key": "tenant", "splits": "v1 = 100\nv2 = 0"}

    response = admin_client.post(url, form)
    assert response.status_code == 200
    assert "must be a positive integer" in response.content.decode()
    assert not Route.objects.exists()

    response = admin_client.post(url, {**form, "splits": "v1 = 90\nv2 = 10"})
    assert response.status_code == 302
    route = Route.objects.get(model=llm)
    assert sorted(route.splits.values_list("version__label", "weight")) == [("v1", 90), ("v2", 10)]
    assert AuditEvent.objects.filter(action="route.set").exists()


def test_route_form_refuses_an_unknown_label(admin_client, llm, published):
    form = {"model": llm.pk, "sticky_key": "tenant", "splits": "v7 = 100"}
    response = admin_client.post(reverse("admin:registry_route_add"), form)
    assert response.status_code == 200
    assert "naming a version of tiny-llama" in response.content.decode()
