"""The tenant page's key management and balance panel: the REST API's services and role rule."""

from __future__ import annotations

import html
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.billing.services import budget_set, credit_grant, usage_record_create
from apps.safety.models import Intervention
from apps.tenants.models import ApiKey, Membership, Tenant
from apps.tenants.services import api_key_create, api_key_digest

pytestmark = pytest.mark.integration

PAGE = "/dashboard/t/acme/"


def _client(user: User, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


@pytest.fixture
def admin(people: dict[str, User]) -> User:
    user = User.objects.create_user("carol", password="pw-carol")
    Membership.objects.create(user=user, tenant=Tenant.objects.get(slug="acme"), role="admin")
    return user


def test_admin_creates_a_key_whose_secret_is_shown_once_then_revokes_it(admin: User) -> None:
    client = _client(admin)
    page = client.get(PAGE).content.decode()
    assert 'id="form-key-create"' in page

    created = client.post(f"{PAGE}keys/", {"name": "ci"})
    assert created.status_code == 200
    key = ApiKey.objects.get(tenant__slug="acme", name="ci")
    secret = created.context["new_secret"]
    assert secret
    assert key.digest == api_key_digest(secret)
    body = created.content.decode()
    assert secret in body
    assert "shown only this once" in body
    assert key.prefix in body

    reload = client.get(PAGE).content.decode()
    assert secret not in reload
    assert 'id="new-secret"' not in reload
    assert key.prefix in reload

    revoked = client.post(f"{PAGE}keys/{key.prefix}/revoke/", follow=True)
    assert revoked.status_code == 200
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert f"API key 'ci' ({key.prefix}) revoked." in html.unescape(revoked.content.decode())


def test_refusals_from_the_service_are_shown_as_messages(admin: User) -> None:
    client = _client(admin)
    empty = client.post(f"{PAGE}keys/", {"name": ""}, follow=True)
    assert empty.status_code == 200
    assert "new_secret" not in empty.context or not empty.context["new_secret"]
    assert 'class="message error"' in empty.content.decode()
    assert not ApiKey.objects.filter(tenant__slug="acme").exists()

    key, _ = api_key_create(actor=None, tenant=Tenant.objects.get(slug="acme"), name="old")
    client.post(f"{PAGE}keys/{key.prefix}/revoke/")
    again = client.post(f"{PAGE}keys/{key.prefix}/revoke/", follow=True)
    assert "is already revoked" in again.content.decode()


def test_a_viewer_can_neither_create_nor_revoke(people: dict[str, User]) -> None:
    key, _ = api_key_create(actor=None, tenant=Tenant.objects.get(slug="acme"), name="prod")
    client = _client(people["alice"])  # viewer of acme
    page = client.get(PAGE).content.decode()
    assert 'id="form-key-create"' not in page
    assert "Revoke" not in page

    assert client.post(f"{PAGE}keys/", {"name": "sneaky"}).status_code == 403
    assert client.post(f"{PAGE}keys/{key.prefix}/revoke/").status_code == 403
    key.refresh_from_db()
    assert key.revoked_at is None
    assert list(ApiKey.objects.filter(tenant__slug="acme")) == [key]


def test_another_tenants_member_cannot_touch_this_tenants_keys(people: dict[str, User]) -> None:
    key, _ = api_key_create(actor=None, tenant=Tenant.objects.get(slug="acme"), name="prod")
    client = _client(people["bob"])  # owner of globex, not in acme
    assert client.post(f"{PAGE}keys/", {"name": "sneaky"}).status_code == 404
    assert client.post(f"{PAGE}keys/{key.prefix}/revoke/").status_code == 404
    # nor through his own tenant's URL: the key is looked up within the tenant
    assert client.post(f"/dashboard/t/globex/keys/{key.prefix}/revoke/").status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None
    assert not ApiKey.objects.filter(name="sneaky").exists()


def test_staff_without_a_membership_may_watch_but_not_manage(people: dict[str, User]) -> None:
    client = _client(people["staff"])
    assert client.get(PAGE).status_code == 200
    assert client.post(f"{PAGE}keys/", {"name": "ops"}).status_code == 403


def test_anonymous_and_get_are_refused(admin: User) -> None:
    response = Client().post(f"{PAGE}keys/", {"name": "x"})
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]
    assert _client(admin).get(f"{PAGE}keys/").status_code == 405
    assert not ApiKey.objects.exists()


def test_csrf_token_is_required(admin: User) -> None:
    client = _client(admin, csrf=True)
    assert client.post(f"{PAGE}keys/", {"name": "ci"}).status_code == 403
    assert not ApiKey.objects.exists()

    page = client.get(PAGE)
    token = page.cookies["csrftoken"].value
    created = client.post(f"{PAGE}keys/", {"name": "ci", "csrfmiddlewaretoken": token})
    assert created.status_code == 200
    key = ApiKey.objects.get(name="ci")
    assert client.post(f"{PAGE}keys/{key.prefix}/revoke/").status_code == 403
    key.refresh_from_db()
    assert key.revoked_at is None


def test_balance_and_budget_panel_shows_the_ledger(people: dict[str, User]) -> None:
    acme = Tenant.objects.get(slug="acme")
    empty = _client(people["alice"]).get(PAGE).content.decode()
    assert "Balance: <strong>0</strong>" in empty
    assert "no budgets" in empty

    credit_grant(actor=None, tenant=acme, amount="125.5", reason="welcome")
    budget_set(actor=None, tenant=acme, period="month", soft_alert_pct=50, hard_cap="40")
    usage_record_create(
        event_id="evt-dash-1",
        tenant=acme,
        request_class="interactive",
        tokens_in=10,
        tokens_out=20,
        credits="30",
        cached=False,
        outcome="ok",
        occurred_at=datetime.now(tz=UTC),
    )
    response = _client(people["alice"]).get(PAGE)
    rows = response.context["budgets"]
    assert [(r.period, r.spent, r.hard_cap, r.soft_alert_at) for r in rows] == [
        ("month", 30, 40, 20)
    ]
    body = response.content.decode()
    assert "125.5" in body
    assert "over soft alert" in body
    assert "(50%)" in body


def test_the_tenant_page_lists_its_safety_interventions(admin: User) -> None:
    acme = Tenant.objects.get(slug="acme")
    Intervention.objects.create(event_id="r9:output:stop:house:no-secret", tenant=acme,
                                api_key="abcd1234", model="chatty", request_id="r9",
                                stage="output", action="stop", pack="house", rule="no-secret",
                                occurred_at=datetime.now(tz=UTC))  # fmt: skip
    page = _client(admin).get(PAGE).content.decode()
    table = page.split('id="table-interventions"', 1)[1].split("</table>", 1)[0]
    assert "house / no-secret" in table
    assert "<td>stop</td>" in table
    assert "abcd1234" in table
