"""pool_create / pool_update / endpoint_register / endpoint_set_state / route_set."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.common.models import AuditEvent
from apps.models.models import Endpoint, Pool, Route
from apps.models.services import (
    endpoint_register,
    endpoint_set_state,
    model_create,
    pool_create,
    pool_update,
    route_set,
)

pytestmark = [pytest.mark.db, pytest.mark.django_db]

POOL = {"name": "gpu-a", "hardware_tier": "h100", "cost_per_replica_hour": Decimal("4.5")}


def errors_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> dict[str, list[str]]:
    return excinfo.value.message_dict


# --- pools ----------------------------------------------------------------------------------


def test_pool_create_audits_and_publishes(pool, publishes):
    assert (pool.min_replicas, pool.warm_replicas, pool.max_replicas) == (0, 1, 4)
    assert pool.cost_per_replica_hour == Decimal("0.25")
    event = AuditEvent.objects.get(action="pool.create")
    assert event.after["policies"] == {"fairness": "vtc"}
    assert event.after["cost_per_replica_hour"] == "0.25"
    assert publishes.pending


def test_pool_create_defaults(db):
    pool = pool_create(actor=None, **POOL)
    assert (pool.min_replicas, pool.warm_replicas, pool.max_replicas, pool.policies) == (
        0,
        0,
        1,
        {},
    )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "GPU A"}, "name"),
        ({"name": ""}, "name"),
        ({"hardware_tier": ""}, "hardware_tier"),
        ({"hardware_tier": "H 100"}, "hardware_tier"),
        ({"cost_per_replica_hour": Decimal("-0.01")}, "cost_per_replica_hour"),
        ({"cost_per_replica_hour": "free"}, "cost_per_replica_hour"),
        ({"cost_per_replica_hour": Decimal("0.00001")}, "cost_per_replica_hour"),
        ({"min_replicas": 3, "max_replicas": 2, "warm_replicas": 2}, "min_replicas"),
        ({"max_replicas": 2, "warm_replicas": 3}, "warm_replicas"),
        ({"max_replicas": -1}, "max_replicas"),
        ({"policies": ["vtc"]}, "policies"),
        ({"policies": {"fairness": 1}}, "policies"),
        ({"policies": {"": "vtc"}}, "policies"),
        ({"policies": {"fairness": "vtcc"}}, "policies"),
        ({"policies": {"fairnes": "vtc"}}, "policies"),
        ({"policies": {"ordering": "lifo"}}, "policies"),
        ({"policies": {"saturation": "vibes"}}, "policies"),
        ({"policies": {"headroom": "1.5"}}, "policies"),
        ({"policies": {"max_queue": "0"}}, "policies"),
        ({"policies": {"band_shares": "1:0.9,2:0.2"}}, "policies"),
        ({"policies": {"filters": "ready,teleport"}}, "policies"),
        ({"policies": {"scorers": "least_load:-1"}}, "policies"),
        ({"policies": {"picker": "coin_flip"}}, "policies"),
        ({"policies": {"upstream_priority": "yes"}}, "policies"),
    ],
)
def test_pool_create_refuses_bad_values(db, overrides, field):
    with pytest.raises(ValidationError) as excinfo:
        pool_create(actor=None, **{**POOL, **overrides})
    assert field in errors_of(excinfo)
    assert not Pool.objects.exists()


def test_pool_policy_error_names_the_bad_value_and_the_known_ones(db):
    with pytest.raises(ValidationError) as excinfo:
        pool_create(actor=None, **POOL, policies={"fairness": "vtcc"})
    [message] = errors_of(excinfo)["policies"]
    assert "unknown fairness policy 'vtcc'" in message
    assert "known: fcfs, round_robin, vtc" in message


def test_pool_accepts_every_registered_name_and_parameter(db):
    policies = {
        "fairness": "fcfs", "ordering": "fcfs", "saturation": "inflight_only",
        "headroom": "0.1", "max_queue": "50", "band_shares": "1:0.2",
        "filters": "ready,health", "scorers": "least_load:2,kv_use", "picker": "max_score",
        "upstream_priority": "on",
    }  # fmt: skip
    assert pool_create(actor=None, **POOL, policies=policies).policies == policies


def test_pool_update_refuses_an_unknown_policy(pool):
    with pytest.raises(ValidationError) as excinfo:
        pool_update(actor=None, pool=pool, policies={"fairness": "drr"})
    assert "policies" in errors_of(excinfo)
    pool.refresh_from_db()
    assert pool.policies == {"fairness": "vtc"}


def test_pool_create_refuses_duplicate_name(pool):
    with pytest.raises(ValidationError) as excinfo:
        pool_create(actor=None, **{**POOL, "name": pool.name})
    assert errors_of(excinfo)["name"] == ["A pool named 'cpu-pool' already exists."]


def test_pool_update_changes_audits_and_publishes(pool, publishes):
    publishes.reset()
    returned = pool_update(
        actor=None, pool=pool, max_replicas=8, warm_replicas=2, cost_per_replica_hour="1.5"
    )

    assert returned is pool
    assert (pool.max_replicas, pool.warm_replicas, pool.cost_per_replica_hour) == (
        8,
        2,
        Decimal("1.5"),
    )
    event = AuditEvent.objects.get(action="pool.update")
    assert (event.before["max_replicas"], event.after["max_replicas"]) == (4, 8)
    assert publishes.pending


def test_pool_update_checks_the_merged_values(pool):
    with pytest.raises(ValidationError) as excinfo:
        pool_update(actor=None, pool=pool, max_replicas=0)  # warm is 1
    assert "warm_replicas" in errors_of(excinfo)
    pool.refresh_from_db()
    assert pool.max_replicas == 4


def test_pool_update_refuses_unknown_fields(pool):
    with pytest.raises(ValidationError) as excinfo:
        pool_update(actor=None, pool=pool, created_at=None)
    assert "created_at" in errors_of(excinfo)


# --- endpoints ------------------------------------------------------------------------------


@pytest.fixture
def endpoint(pool, published):
    return endpoint_register(
        actor=None, pool=pool, version=published, base_url="http://10.0.0.5:8000/", capacity=16
    )


def test_endpoint_register_starts_audits_and_publishes(endpoint, publishes):
    assert endpoint.state == Endpoint.State.STARTING
    assert endpoint.base_url == "http://10.0.0.5:8000"
    event = AuditEvent.objects.get(action="endpoint.register")
    assert event.after["base_url"] == "http://10.0.0.5:8000"
    assert publishes.pending


def test_endpoint_register_refuses_an_unpublished_version(pool, draft):
    with pytest.raises(ValidationError) as excinfo:
        endpoint_register(
            actor=None, pool=pool, version=draft, base_url="http://w:8000", capacity=4
        )
    assert errors_of(excinfo)["version"] == [
        "Version tiny-llama:draft is not published; publish it first."
    ]


@pytest.mark.parametrize(
    ("base_url", "capacity", "field"),
    [
        ("ftp://10.0.0.5", 4, "base_url"),
        ("10.0.0.5:8000", 4, "base_url"),
        ("http://", 4, "base_url"),
        ("http://w:8000", 0, "capacity"),
        ("http://w:8000", -3, "capacity"),
        ("http://w:8000", 2.5, "capacity"),
    ],
)
def test_endpoint_register_refuses_bad_values(pool, published, base_url, capacity, field):
    with pytest.raises(ValidationError) as excinfo:
        endpoint_register(
            actor=None, pool=pool, version=published, base_url=base_url, capacity=capacity
        )
    assert field in errors_of(excinfo)
    assert not Endpoint.objects.exists()


def test_endpoint_register_refuses_a_second_live_endpoint_on_one_url(endpoint, pool, published):
    with pytest.raises(ValidationError, match=r"already serves http://10\.0\.0\.5:8000"):
        endpoint_register(
            actor=None, pool=pool, version=published, base_url="http://10.0.0.5:8000", capacity=4
        )

    endpoint_set_state(actor=None, endpoint=endpoint, state="gone")
    again = endpoint_register(
        actor=None, pool=pool, version=published, base_url="http://10.0.0.5:8000", capacity=4
    )
    assert again.state == "starting"


@pytest.mark.parametrize(
    "path",
    [
        ["ready"],
        ["draining"],
        ["gone"],
        ["ready", "draining"],
        ["ready", "gone"],
        ["ready", "draining", "ready"],
        ["ready", "draining", "gone"],
    ],
)
def test_endpoint_allowed_transitions(endpoint, path, publishes):
    for state in path:
        publishes.reset()
        returned = endpoint_set_state(actor=None, endpoint=endpoint, state=state)
        assert returned.state == state
        assert Endpoint.objects.get(pk=endpoint.pk).state == state
        assert publishes.pending
    events = AuditEvent.objects.filter(action="endpoint.set_state").order_by("id")
    assert [event.after["state"] for event in events] == path


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        (["ready"], "starting"),
        (["draining"], "starting"),
        (["gone"], "ready"),
        (["gone"], "starting"),
        (["gone"], "draining"),
    ],
)
def test_endpoint_refused_transitions(endpoint, path, refused):
    for state in path:
        endpoint_set_state(actor=None, endpoint=endpoint, state=state)
    with pytest.raises(ValidationError) as excinfo:
        endpoint_set_state(actor=None, endpoint=endpoint, state=refused)
    assert f"cannot go from {path[-1]} to {refused}" in errors_of(excinfo)["state"][0]
    assert Endpoint.objects.get(pk=endpoint.pk).state == path[-1]


def test_endpoint_unknown_state_is_refused(endpoint):
    with pytest.raises(ValidationError) as excinfo:
        endpoint_set_state(actor=None, endpoint=endpoint, state="sleeping")
    assert "State must be one of" in errors_of(excinfo)["state"][0]


def test_endpoint_same_state_is_a_no_op(endpoint, publishes):
    publishes.reset()
    endpoint_set_state(actor=None, endpoint=endpoint, state="starting")
    assert not AuditEvent.objects.filter(action="endpoint.set_state").exists()
    assert not publishes.pending


# --- routes ---------------------------------------------------------------------------------


def test_route_set_creates_then_replaces(llm, make_version, admin_user, publishes):
    v1 = make_version("v1", publish=True)
    v2 = make_version("v2", publish=True)
    publishes.reset()

    route = route_set(actor=admin_user, model=llm, splits=[(v1, 100)])
    assert publishes.pending
    route = route_set(actor=admin_user, model=llm, splits=[(v1, 90), (v2, 10)], sticky_key="user")

    route.refresh_from_db()
    assert route.sticky_key == "user"
    assert sorted(route.splits.values_list("version__label", "weight")) == [("v1", 90), ("v2", 10)]
    assert Route.objects.count() == 1
    first, second = AuditEvent.objects.filter(action="route.set").order_by("id")
    assert first.before is None
    assert second.before == {"sticky_key": "tenant", "splits": [{"version": v1.pk, "weight": 100}]}
    assert second.after["splits"] == [
        {"version": v1.pk, "weight": 90},
        {"version": v2.pk, "weight": 10},
    ]


@pytest.mark.parametrize("weight", [0, -5, 1.5, True])
def test_route_set_refuses_non_positive_integer_weights(llm, published, weight):
    with pytest.raises(ValidationError) as excinfo:
        route_set(actor=None, model=llm, splits=[(published, weight)])
    assert "must be a positive integer" in errors_of(excinfo)["splits"][0]
    assert not Route.objects.exists()


def test_route_set_refuses_no_splits(llm):
    with pytest.raises(ValidationError) as excinfo:
        route_set(actor=None, model=llm, splits=[])
    assert errors_of(excinfo)["splits"] == ["A route needs at least one split."]


def test_route_set_refuses_duplicate_versions(llm, published):
    with pytest.raises(ValidationError, match="appears more than once"):
        route_set(actor=None, model=llm, splits=[(published, 50), (published, 50)])


def test_route_set_refuses_unpublished_versions(llm, published, draft):
    with pytest.raises(ValidationError, match="tiny-llama:draft is not published"):
        route_set(actor=None, model=llm, splits=[(published, 50), (draft, 50)])


def test_route_set_refuses_versions_of_another_model(llm, published, make_version):
    other = model_create(actor=None, name="other", task="chat")
    foreign = make_version("x1", publish=True, model=other)
    with pytest.raises(ValidationError, match="does not belong to model 'tiny-llama'"):
        route_set(actor=None, model=llm, splits=[(published, 50), (foreign, 50)])


def test_route_set_refuses_unknown_sticky_key(llm, published):
    with pytest.raises(ValidationError) as excinfo:
        route_set(actor=None, model=llm, splits=[(published, 1)], sticky_key="ip")
    assert "sticky_key" in errors_of(excinfo)


def test_route_set_keeps_the_old_splits_when_refused(llm, published, draft):
    route_set(actor=None, model=llm, splits=[(published, 100)])
    with pytest.raises(ValidationError):
        route_set(actor=None, model=llm, splits=[(draft, 100)])
    assert list(Route.objects.get(model=llm).splits.values_list("version_id", "weight")) == [
        (published.pk, 100)
    ]


def test_warm_replicas_are_extra_to_the_minimum(db):
    """Warm replicas are loaded but unrouted, on top of the serving ones (apps.scaling): a pool
    may keep one replica serving and none warm."""
    pool = pool_create(actor=None, **{**POOL, "min_replicas": 1, "max_replicas": 2})
    assert (pool.min_replicas, pool.warm_replicas, pool.max_replicas) == (1, 0, 2)
