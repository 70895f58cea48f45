"""api_key_create / api_key_revoke / api_key_touch."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.common.models import AuditEvent
from apps.tenants.models import ApiKey
from apps.tenants.services import api_key_create, api_key_revoke, api_key_touch

pytestmark = [pytest.mark.db, pytest.mark.django_db]

KEY_RE = re.compile(r"^sy_([a-z0-9]{8})_[A-Za-z0-9]{40}$")


def test_create_returns_full_key_once_and_stores_only_digest(admin_user, tenant, publishes):
    publishes.reset()

    api_key, full_key = api_key_create(actor=admin_user, tenant=tenant, name="ci")

    match = KEY_RE.fullmatch(full_key)
    assert match is not None
    api_key.refresh_from_db()
    assert api_key.prefix == match.group(1)
    assert api_key.digest == hashlib.sha256(full_key.encode()).hexdigest()
    assert api_key.scopes == ["inference"]
    assert api_key.expires_at is None
    secret = full_key.rsplit("_", 1)[1]
    stored = json.dumps([str(v) for v in ApiKey.objects.values().get(pk=api_key.pk).values()])
    assert secret not in stored
    event = AuditEvent.objects.get(action="api_key.create")
    assert secret not in json.dumps(event.after)
    assert event.after == {
        "tenant": tenant.slug,
        "name": "ci",
        "prefix": api_key.prefix,
        "scopes": ["inference"],
        "expires_at": None,
    }
    assert publishes.pending


def test_create_makes_distinct_keys(tenant):
    keys = {api_key_create(actor=None, tenant=tenant, name=f"k{i}")[1] for i in range(5)}

    assert len(keys) == 5
    assert ApiKey.objects.values("prefix").distinct().count() == 5


def test_create_with_scopes_and_expiry(tenant):
    expires = timezone.now() + timedelta(days=30)

    api_key, _ = api_key_create(
        actor=None,
        tenant=tenant,
        name="reader",
        scopes=["models:read", "usage:read", "models:read"],
        expires_at=expires,
    )

    api_key.refresh_from_db()
    assert api_key.scopes == ["models:read", "usage:read"]
    assert api_key.expires_at == expires


@pytest.mark.parametrize(
    ("scopes", "message"),
    [
        (["inference", "admin"], "Unknown scope(s): admin"),
        ([], "at least one scope"),
        ("inference", "must be a list"),
        (None, "must be a list"),
    ],
)
def test_create_refuses_bad_scopes(tenant, scopes, message):
    with pytest.raises(ValidationError) as excinfo:
        api_key_create(actor=None, tenant=tenant, name="k", scopes=scopes)

    assert message in excinfo.value.message_dict["scopes"][0]
    assert not ApiKey.objects.exists()
    assert not AuditEvent.objects.filter(action="api_key.create").exists()


def test_create_refuses_expiry_in_the_past(tenant):
    with pytest.raises(ValidationError) as excinfo:
        api_key_create(
            actor=None, tenant=tenant, name="k", expires_at=timezone.now() - timedelta(seconds=1)
        )

    assert "Expiry must be in the future" in excinfo.value.message_dict["expires_at"][0]
    assert not ApiKey.objects.exists()


def test_create_refuses_naive_expiry(tenant):
    with pytest.raises(ValidationError) as excinfo:
        api_key_create(actor=None, tenant=tenant, name="k", expires_at=datetime(2999, 1, 1))

    assert "time zone" in excinfo.value.message_dict["expires_at"][0]


@pytest.mark.parametrize("name", ["", "  ", "n" * 101])
def test_create_refuses_bad_name(tenant, name):
    with pytest.raises(ValidationError) as excinfo:
        api_key_create(actor=None, tenant=tenant, name=name)

    assert "name" in excinfo.value.message_dict


def test_revoke_sets_revoked_at_audits_and_publishes(admin_user, tenant, publishes):
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="ci")
    publishes.reset()

    api_key_revoke(actor=admin_user, api_key=api_key)

    api_key.refresh_from_db()
    assert api_key.revoked_at is not None
    event = AuditEvent.objects.get(action="api_key.revoke")
    assert event.before == {"revoked_at": None}
    assert event.after == {"revoked_at": api_key.revoked_at.isoformat()}
    assert event.actor_id == admin_user.pk
    assert publishes.pending


def test_revoke_twice_refused(tenant):
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="ci")
    api_key_revoke(actor=None, api_key=api_key)

    with pytest.raises(ValidationError, match="already revoked"):
        api_key_revoke(actor=None, api_key=api_key)
    assert AuditEvent.objects.filter(action="api_key.revoke").count() == 1


def test_revoke_through_a_stale_copy_refused(tenant):
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="ci")
    stale = ApiKey.objects.get(pk=api_key.pk)
    api_key_revoke(actor=None, api_key=api_key)

    with pytest.raises(ValidationError, match="already revoked"):
        api_key_revoke(actor=None, api_key=stale)


def test_touch_records_last_use_without_audit_or_publish(tenant, publishes):
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="ci")
    publishes.reset()
    events = AuditEvent.objects.count()
    used_at = timezone.now()

    api_key_touch(prefix=api_key.prefix, used_at=used_at)

    api_key.refresh_from_db()
    assert api_key.last_used_at == used_at
    assert AuditEvent.objects.count() == events
    assert not publishes.pending


def test_touch_never_moves_backwards(tenant):
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="ci")
    later = timezone.now()
    api_key_touch(prefix=api_key.prefix, used_at=later)

    api_key_touch(prefix=api_key.prefix, used_at=later - timedelta(minutes=5))

    api_key.refresh_from_db()
    assert api_key.last_used_at == later


def test_touch_unknown_prefix_is_a_no_op(tenant):
    api_key_touch(prefix="zzzzzzzz", used_at=timezone.now())

    assert not ApiKey.objects.filter(last_used_at__isnull=False).exists()
