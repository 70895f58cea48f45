"""Tenant self-service: every endpoint's happy path and its refusals."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.common.models import AuditEvent
from apps.tenants.models import ApiKey, ManagementToken
from apps.tenants.services import api_key_digest
from apps.tenants.services.management_tokens import management_token_digest
from tests.api.conftest import World, session_client, token_client

pytestmark = pytest.mark.db

BASE = "/api/v1/tenants/acme"


def test_me_lists_memberships_and_operator_flag(world: World) -> None:
    body = session_client(world.a.users["admin"]).get("/api/v1/me/").json()
    assert body == {
        "username": "acme-admin",
        "operator": False,
        "memberships": [{"tenant": "acme", "role": "admin"}],
    }
    token_body = token_client(world.a.tokens["viewer"][1]).get("/api/v1/me/").json()
    assert token_body["memberships"] == [{"tenant": "acme", "role": "viewer"}]
    assert token_body["username"].startswith("token:")
    assert session_client(world.staff).get("/api/v1/me/").json()["operator"] is True


def test_tenant_and_entitlements(world: World) -> None:
    client = token_client(world.a.tokens["viewer"][1])
    tenant = client.get(f"{BASE}/").json()
    assert tenant["slug"] == "acme"
    assert tenant["role"] == "viewer"
    assert tenant["rpm_limit"] == 600
    entitlements = client.get(f"{BASE}/entitlements/").json()
    assert entitlements == {
        "classes": ["interactive", "standard"],
        "default_class": "interactive",
        "models": [],
        "all_models": True,
    }


def test_anonymous_gets_401_with_the_error_shape(world: World) -> None:
    response = APIClient().get(f"{BASE}/")
    assert response.status_code in (401, 403)
    assert response.json()["error"]["code"] == "not_authenticated"


def test_bad_token_is_401(world: World) -> None:
    response = token_client("sym_abcdefgh_" + "x" * 40).get(f"{BASE}/")
    assert response.status_code == 401
    assert response.json()["error"] == {
        "code": "authentication_failed",
        "message": "Invalid management token.",
    }


def test_create_key_shows_the_secret_once_and_stores_a_digest(world: World) -> None:
    client = session_client(world.a.users["admin"])
    response = client.post(
        f"{BASE}/api-keys/", {"name": "batch jobs", "scopes": ["inference"]}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    stored = ApiKey.objects.get(prefix=body["prefix"])
    assert body["key"].startswith(f"sy_{stored.prefix}_")
    assert stored.digest == api_key_digest(body["key"])
    assert stored.tenant == world.a.tenant
    listed = client.get(f"{BASE}/api-keys/").json()
    assert {k["prefix"] for k in listed["results"]} == {stored.prefix, world.a.key.prefix}
    assert all("key" not in k for k in listed["results"])
    detail = client.get(f"{BASE}/api-keys/{stored.prefix}/").json()
    assert "key" not in detail
    assert detail["active"] is True
    assert detail["last_used_at"] is None


def test_create_key_refusals_carry_the_service_message(world: World) -> None:
    client = session_client(world.a.users["owner"])
    blank = client.post(f"{BASE}/api-keys/", {"name": "   "}, format="json")
    assert blank.status_code == 400
    assert blank.json()["error"]["fields"]["name"] == ["Name must not be blank."]
    past = timezone.now() - dt.timedelta(hours=1)
    expired = client.post(
        f"{BASE}/api-keys/", {"name": "x", "expires_at": past.isoformat()}, format="json"
    )
    assert expired.json()["error"]["fields"] == {"expires_at": ["Expiry must be in the future."]}
    scopes = client.post(f"{BASE}/api-keys/", {"name": "x", "scopes": []}, format="json")
    assert scopes.json()["error"]["fields"] == {"scopes": ["An API key needs at least one scope."]}
    unknown = client.post(f"{BASE}/api-keys/", {"name": "x", "scopes": ["root"]}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "invalid"


def test_revoke_key_and_revoke_twice(world: World) -> None:
    client = token_client(world.a.tokens["admin"][1])
    url = f"{BASE}/api-keys/{world.a.key.prefix}/revoke/"
    first = client.post(url)
    assert first.status_code == 200
    assert first.json()["active"] is False
    assert first.json()["revoked_at"] is not None
    again = client.post(url)
    assert again.status_code == 400
    assert again.json()["error"]["fields"] == {
        "non_field_errors": [f"API key '{world.a.key.prefix}' is already revoked."]
    }
    event = AuditEvent.objects.filter(action="api_key.revoke").get()
    assert event.actor_label == f"token:{world.a.tokens['admin'][0].prefix}"


def test_rotate_key_keeps_the_old_one_for_the_overlap(world: World) -> None:
    client = session_client(world.a.users["admin"])
    before = timezone.now()
    response = client.post(
        f"{BASE}/api-keys/{world.a.key.prefix}/rotate/", {"overlap_s": 600}, format="json"
    )
    assert response.status_code == 201, response.content
    successor = ApiKey.objects.get(prefix=response.json()["prefix"])
    assert successor.name == world.a.key.name
    assert successor.scopes == world.a.key.scopes
    assert successor.digest == api_key_digest(response.json()["key"])
    old = ApiKey.objects.get(pk=world.a.key.pk)
    assert old.revoked_at is None
    assert (
        before + dt.timedelta(seconds=599)
        < old.expires_at
        < timezone.now() + dt.timedelta(seconds=601)
    )
    # Rotating with no overlap ends the old key now; rotating a revoked key is refused.
    zero = client.post(
        f"{BASE}/api-keys/{successor.prefix}/rotate/", {"overlap_s": 0}, format="json"
    )
    assert zero.status_code == 201
    client.post(f"{BASE}/api-keys/{zero.json()['prefix']}/revoke/")
    refused = client.post(f"{BASE}/api-keys/{zero.json()['prefix']}/rotate/", {}, format="json")
    assert refused.status_code == 400
    assert "is revoked; it cannot be rotated" in refused.json()["error"]["message"]
    too_long = client.post(
        f"{BASE}/api-keys/{world.a.key.prefix}/rotate/", {"overlap_s": 10**9}, format="json"
    )
    assert too_long.status_code == 400
    assert "overlap_s" in too_long.json()["error"]["fields"]


def test_owner_manages_tokens_and_a_revoked_token_stops(world: World) -> None:
    owner = session_client(world.a.users["owner"])
    created = owner.post(f"{BASE}/tokens/", {"name": "terraform", "role": "admin"}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    stored = ManagementToken.objects.get(prefix=body["prefix"])
    assert stored.digest == management_token_digest(body["token"])
    assert body["token"] not in str(list(ManagementToken.objects.values()))
    new_client = token_client(body["token"])
    assert new_client.get(f"{BASE}/api-keys/").status_code == 200
    listed = owner.get(f"{BASE}/tokens/").json()["results"]
    assert all("token" not in t for t in listed)
    assert owner.post(f"{BASE}/tokens/{stored.prefix}/revoke/").status_code == 200
    stopped = new_client.get(f"{BASE}/api-keys/")
    assert stopped.status_code == 401
    assert stopped.json()["error"]["message"] == "This management token was revoked."


def test_token_refusals(world: World) -> None:
    owner_token = token_client(world.a.tokens["owner"][1])
    response = owner_token.post(f"{BASE}/tokens/", {"name": "x", "role": "boss"}, format="json")
    assert response.status_code == 400
    assert "role" in response.json()["error"]["fields"]
    blank = owner_token.post(f"{BASE}/tokens/", {"name": "", "role": "viewer"}, format="json")
    assert blank.json()["error"]["fields"] == {"name": ["Name must not be blank."]}
    past = (timezone.now() - dt.timedelta(minutes=1)).isoformat()
    expired = owner_token.post(
        f"{BASE}/tokens/", {"name": "x", "role": "viewer", "expires_at": past}, format="json"
    )
    assert expired.json()["error"]["fields"] == {"expires_at": ["Expiry must be in the future."]}
    prefix = world.a.tokens["viewer"][0].prefix
    assert owner_token.post(f"{BASE}/tokens/{prefix}/revoke/").status_code == 200
    twice = owner_token.post(f"{BASE}/tokens/{prefix}/revoke/")
    assert twice.status_code == 400
    assert "already revoked" in twice.json()["error"]["message"]
    assert owner_token.post(f"{BASE}/tokens/nope/revoke/").status_code == 404


def test_usage_records_summary_and_csv(world: World) -> None:
    client = token_client(world.a.tokens["viewer"][1])
    records = client.get(f"{BASE}/usage/?page_size=2").json()
    assert [r["event_id"] for r in records["results"]] == ["acme-event-2", "acme-event-1"]
    assert records["next"] is not None
    rest = client.get(records["next"]).json()
    assert [r["event_id"] for r in rest["results"]] == ["acme-event-0"]
    by_class = client.get(f"{BASE}/usage/summary/?group_by=class").json()
    assert by_class["rows"] == [
        {
            "group": "interactive",
            "requests": 2,
            "tokens_in": 30,
            "tokens_out": 10,
            "credits": "1.000000",
        },
        {
            "group": "standard",
            "requests": 1,
            "tokens_in": 30,
            "tokens_out": 5,
            "credits": "0.500000",
        },
    ]
    by_model = client.get(f"{BASE}/usage/summary/?group_by=model").json()["rows"]
    assert by_model == [
        {
            "group": "tiny-llama",
            "requests": 3,
            "tokens_in": 60,
            "tokens_out": 15,
            "credits": "1.500000",
        },
    ]
    by_key = client.get(f"{BASE}/usage/summary/?group_by=key").json()["rows"]
    assert by_key[0]["group"] == world.a.key.prefix
    by_day = client.get(f"{BASE}/usage/summary/").json()
    assert by_day["group_by"] == "day"
    assert len(by_day["rows"]) == 3
    since = (timezone.now() - dt.timedelta(hours=12)).isoformat()
    recent = client.get(f"{BASE}/usage/", {"since": since}).json()["results"]
    assert [r["event_id"] for r in recent] == ["acme-event-0"]
    filtered = client.get(f"{BASE}/usage/?class=standard").json()["results"]
    assert [r["event_id"] for r in filtered] == ["acme-event-2"]
    export = client.get(f"{BASE}/usage/export.csv")
    assert export.status_code == 200
    assert export["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))
    assert [r["event_id"] for r in rows] == ["acme-event-2", "acme-event-1", "acme-event-0"]
    assert rows[0]["model"] == "tiny-llama"
    as_csv = client.get(f"{BASE}/usage/export.csv?model=nope", HTTP_ACCEPT="text/csv")
    assert as_csv.status_code == 200
    assert b"".join(as_csv.streaming_content).decode().startswith("id,event_id,")
    bad = client.get(f"{BASE}/usage/export.csv?since=never", HTTP_ACCEPT="text/csv")
    assert bad.status_code == 400
    assert bad["Content-Type"] == "application/json"
    assert json.loads(bad.content)["error"]["fields"]["since"]


def test_usage_refusals(world: World) -> None:
    client = session_client(world.a.users["viewer"])
    bad_group = client.get(f"{BASE}/usage/summary/?group_by=hour")
    assert bad_group.status_code == 400
    assert bad_group.json()["error"]["fields"] == {
        "group_by": ["Group by one of: day, model, class, key."]
    }
    bad_time = client.get(f"{BASE}/usage/?since=yesterday")
    assert bad_time.status_code == 400
    assert list(bad_time.json()["error"]["fields"]) == ["since"]
    bad_cursor = client.get(f"{BASE}/usage/?cursor=garbage")
    assert bad_cursor.status_code == 404
    assert bad_cursor.json()["error"]["code"] == "not_found"


def test_balance_grants_and_budgets(world: World) -> None:
    viewer = session_client(world.a.users["viewer"])
    balance = viewer.get(f"{BASE}/balance/").json()
    assert balance["balance"] == "50.000000"
    assert balance["budgets"][0]["period"] == "day"
    grants = viewer.get(f"{BASE}/grants/").json()["results"]
    assert [(g["amount"], g["reason"]) for g in grants] == [("50", "welcome acme")]
    budget = viewer.get(f"{BASE}/budgets/day/")
    assert budget.status_code == 200
    etag = budget["ETag"]
    owner = session_client(world.a.users["owner"])
    no_match = owner.patch(f"{BASE}/budgets/day/", {"soft_alert_pct": 50}, format="json")
    assert no_match.status_code == 428
    assert no_match.json()["error"]["code"] == "precondition_required"
    changed = owner.patch(
        f"{BASE}/budgets/day/", {"soft_alert_pct": 50}, format="json", HTTP_IF_MATCH=etag
    )
    assert changed.status_code == 200, changed.content
    assert changed.json()["soft_alert_pct"] == 50
    assert changed.json()["hard_cap"] == "100.000000"
    assert changed["ETag"] != etag
    stale = owner.patch(
        f"{BASE}/budgets/day/", {"soft_alert_pct": 60}, format="json", HTTP_IF_MATCH=etag
    )
    assert stale.status_code == 412
    assert stale.json()["error"]["code"] == "precondition_failed"
    invalid = owner.patch(
        f"{BASE}/budgets/day/",
        {"soft_alert_pct": 0},
        format="json",
        HTTP_IF_MATCH=changed["ETag"],
    )
    assert invalid.status_code == 400
    assert invalid.json()["error"]["fields"] == {
        "soft_alert_pct": ["Soft alert must be a whole percentage from 1 to 100."]
    }
    assert owner.get(f"{BASE}/budgets/month/").status_code == 404


def test_tenant_audit_log_shows_own_objects_only(world: World) -> None:
    client = session_client(world.a.users["viewer"])
    events = client.get(f"{BASE}/audit/?page_size=100").json()["results"]
    targets = {e["target_repr"] for e in events}
    assert "acme" in targets
    assert not any("globex" in e["target_repr"] for e in events)
    assert not any("globex" in str(e["after"]) for e in events)
    keys = client.get(f"{BASE}/audit/?action=api_key.").json()["results"]
    assert {e["action"] for e in keys} == {"api_key.create"}
    bad = client.get(f"{BASE}/audit/?until=soon")
    assert bad.status_code == 400
