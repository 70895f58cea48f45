"""Header-based sticky assignment: a rollout names a request header; while it holds traffic
the snapshot's route carries the name and the router assigns versions by the header's value
(one value, one version, whatever the tenant); without the header the route's key applies."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from apps.core.selectors import snapshot_build
from apps.rollouts.services import rollout_create
from apps.rollouts.transitions import rollout_rollback, rollout_start, rollout_warmed
from runtime.routing.versions import choose_version, header_value

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.fixture
def ab(llm, stable, candidate):
    def make(sticky_header: str = "X-Session-Id"):
        return rollout_create(
            actor=None, model=llm, stable_version=stable, candidate_version=candidate,
            mode="ab", steps=[50], sticky_header=sticky_header,
        )  # fmt: skip

    return make


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Authorization", "cannot assign versions"),
        ("cookie", "cannot assign versions"),
        ("x session", "must be an HTTP header name"),
        ("x" * 65, "must be an HTTP header name"),
    ],
)
def test_unusable_header_names_are_refused(ab, name, message):
    with pytest.raises(ValidationError) as refused:
        ab(name)
    assert message in " ".join(refused.value.message_dict["sticky_header"])


def test_the_header_name_is_stored_lower_case_and_reaches_the_snapshot_while_running(
    ab, llm, ready_endpoints
):
    ready_endpoints()
    rollout = ab()
    assert rollout.sticky_header == "x-session-id"
    rollout_start(actor=None, rollout=rollout)
    assert snapshot_build().routes.get(llm.name) is None  # no traffic moved yet

    rollout_warmed(actor=None, rollout=rollout)
    assert snapshot_build().routes[llm.name].sticky_header == "x-session-id"

    rollout_rollback(actor=None, rollout=rollout, reason="done")
    assert snapshot_build().routes[llm.name].sticky_header == ""


def test_one_header_value_sees_one_version_across_requests_and_tenants(ab, llm, ready_endpoints):
    ready_endpoints()
    rollout = ab()
    rollout_start(actor=None, rollout=rollout)
    rollout_warmed(actor=None, rollout=rollout)
    snapshot = snapshot_build()
    model = snapshot.models[llm.name]

    seen: dict[str, set[str]] = {}
    for session in range(60):
        for tenant in ("acme", "globex", "initech"):
            headers = [(b"accept", b"*/*"), (b"x-session-id", f"s-{session}".encode())]
            version = choose_version(snapshot, model, tenant=tenant, user="u", headers=headers)
            seen.setdefault(f"s-{session}", set()).add(version.label)
    assert all(len(labels) == 1 for labels in seen.values())
    shares = sum(labels == {"v2"} for labels in seen.values())
    assert 15 <= shares <= 45  # about half of 60 sessions on the candidate
    # Without the header (or with an empty one), the route's key (the tenant) decides.
    for tenant in ("acme", "globex", "initech"):
        by_tenant = choose_version(snapshot, model, tenant=tenant)
        empty = choose_version(snapshot, model, tenant=tenant, headers=[(b"x-session-id", b" ")])
        assert empty.label == by_tenant.label


def test_header_value_reads_the_first_non_empty_value():
    headers = [(b"x-a", b"1"), (b"x-session-id", b" abc "), (b"x-session-id", b"def")]
    assert header_value(headers, "x-session-id") == "abc"
    assert header_value(headers, "x-missing") is None
