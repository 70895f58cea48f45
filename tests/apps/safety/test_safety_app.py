"""Policy packs in the registry: written through the services from REST and the admin (a
malformed pack is a field error naming the rule's field), attached per tenant and per model,
published in the snapshot, and the interventions listed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from apps.common.models import AuditEvent
from apps.core.selectors import snapshot_build
from apps.models.models import Model
from apps.safety.models import Intervention, PolicyAttachment, PolicyPack
from apps.safety.selectors import safety_snapshot
from apps.safety.services import pack_create
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create

pytestmark = [pytest.mark.db, pytest.mark.django_db]

PACKS = "/api/v1/ops/safety/packs/"
ATTACHMENTS = "/api/v1/ops/safety/attachments/"
TERMS = [{"id": "no-x", "kind": "terms", "action": "refuse", "terms": ["bad thing"]}]


@pytest.fixture
def ops(admin_user: Any) -> APIClient:
    client = APIClient()
    client.force_login(admin_user)
    return client


@pytest.fixture
def tenant() -> Tenant:
    return tenant_create(actor=None, slug="acme", name="Acme", rpm_limit=10, tpm_limit=1000,
                         max_concurrency=2, max_context_tokens=100,
                         max_output_tokens=100)  # fmt: skip


@pytest.mark.parametrize(
    ("rules", "field", "words"),
    [
        ([{"id": "r", "kind": "regex", "action": "refuse", "patterns": ["(unclosed"]}],
         "rules[0].patterns[0]", "not a valid regular expression"),
        ([{"id": "r", "kind": "regex", "action": "refuse", "patterns": ["(a+)+"]}],
         "rules[0].patterns[0]", "exponential"),
        ([*TERMS, {"id": "p", "kind": "pii", "action": "redact", "detectors": ["dna"]}],
         "rules[1].detectors[0]", "unknown detector 'dna'"),
        ([{"id": "c", "kind": "classifier", "action": "refuse", "model": "m", "threshold": 2}],
         "rules[0].threshold", "between 0 and 1"),
        ([{"id": "t", "kind": "terms", "action": "stop", "terms": []}],
         "rules[0].terms", "blocks nothing"),
        ([{"id": "t", "kind": "spells", "action": "stop"}], "rules[0].kind", "unknown kind"),
        ("not a list", "rules", "Expected `array`"),
        (TERMS, "name", "letters, digits"),
    ],
)  # fmt: skip
def test_a_malformed_pack_is_a_field_error_over_rest(
    ops: APIClient, rules: Any, field: str, words: str
) -> None:
    name = "house" if field != "name" else "a house"
    refused = ops.post(PACKS, {"name": name, "rules": rules}, format="json")
    assert refused.status_code == 400, refused.content
    fields = refused.json()["error"]["fields"]
    assert field in fields, fields
    assert any(words in message for message in fields[field]), fields
    assert not PolicyPack.objects.exists()


def test_packs_are_versioned_audited_and_published(ops: APIClient, publishes: Any) -> None:
    publishes.reset()
    first = ops.post(PACKS, {"name": "house", "rules": TERMS}, format="json")
    assert first.status_code == 201, first.content
    assert first.json()["version"] == 1
    assert publishes.pending
    second = ops.post(PACKS, {"name": "house", "rules": [], "description": "off"}, format="json")
    assert second.json()["version"] == 2
    again = ops.post(PACKS, {"name": "house", "version": 2, "rules": TERMS}, format="json")
    assert again.status_code == 400
    assert "version" in again.json()["error"]["fields"]
    assert AuditEvent.objects.filter(action="safety.pack.create").count() == 2
    assert ops.get(f"{PACKS}{first.json()['id']}/").json()["rules"] == TERMS
    assert [p["version"] for p in ops.get(PACKS).json()["results"]] == [2, 1]


def test_attachments_per_tenant_and_model_reach_the_snapshot(
    ops: APIClient, tenant: Tenant
) -> None:
    Model.objects.create(name="chatty", task="chat")
    pack_create(actor=None, name="house", rules=TERMS)
    pack_create(actor=None, name="house", rules=[*TERMS, {
        "id": "mail", "kind": "pii", "action": "redact", "detectors": ["email"]}])  # fmt: skip
    pack_create(actor=None, name="strict", rules=TERMS)
    assert ops.post(ATTACHMENTS, {"pack_name": "house", "tenant": "acme"},
                    format="json").status_code == 201  # fmt: skip
    assert ops.post(ATTACHMENTS, {"pack_name": "strict", "model": "chatty"},
                    format="json").status_code == 201  # fmt: skip
    for body, field in [
        ({"pack_name": "nope", "tenant": "acme"}, "pack_name"),
        ({"pack_name": "house", "tenant": "acme"}, "pack_name"),  # already attached
        ({"pack_name": "house", "tenant": "acme", "model": "chatty"}, "tenant"),
        ({"pack_name": "house"}, "tenant"),
    ]:
        refused = ops.post(ATTACHMENTS, body, format="json")
        assert refused.status_code == 400, body
        assert field in refused.json()["error"]["fields"], refused.json()
    safety = safety_snapshot()
    assert safety.packs["house"].version == 2  # the newest version is the one in force
    assert [r.id for r in safety.packs["house"].rules] == ["no-x", "mail"]
    assert safety.tenants == {"acme": ("house",)}
    assert safety.models == {"chatty": ("strict",)}
    assert snapshot_build().safety == safety
    attachment = PolicyAttachment.objects.get(pack_name="strict")
    assert ops.delete(f"{ATTACHMENTS}{attachment.pk}/").status_code == 204
    assert safety_snapshot().models == {}
    assert AuditEvent.objects.filter(action="safety.attachment.delete").exists()


def test_the_admin_shows_a_malformed_rule_as_a_form_error(admin_client: Any) -> None:
    url = reverse("admin:safety_policypack_add")
    bad = '[{"id": "r", "kind": "regex", "action": "stop", "patterns": ["["]}]'
    response = admin_client.post(url, {"name": "house", "rules": bad, "description": ""})
    assert response.status_code == 200
    assert "rules[0].patterns[0]: not a valid regular expression" in response.content.decode()
    assert not PolicyPack.objects.exists()
    good = '[{"id": "r", "kind": "regex", "action": "stop", "patterns": ["secret \\\\d+"]}]'
    response = admin_client.post(url, {"name": "house", "rules": good, "description": ""})
    assert response.status_code == 302
    assert PolicyPack.objects.get().version == 1
    for name in ("policypack", "policyattachment", "intervention"):
        assert admin_client.get(reverse(f"admin:safety_{name}_changelist")).status_code == 200


def test_interventions_are_listed_per_tenant(ops: APIClient, tenant: Tenant) -> None:
    Intervention.objects.create(event_id="r1:input:refuse:house:no-x", tenant=tenant,
                                api_key="abcd1234", model="m", request_id="r1", stage="input",
                                action="refuse", pack="house", rule="no-x",
                                occurred_at=datetime.now(tz=UTC))  # fmt: skip
    listed = ops.get("/api/v1/ops/safety/interventions/", {"tenant": "acme"}).json()["results"]
    assert [(i["tenant"], i["action"], i["rule"]) for i in listed] == [("acme", "refuse", "no-x")]
    assert ops.get("/api/v1/ops/safety/interventions/", {"tenant": "other"}).json()[
        "results"] == []  # fmt: skip
