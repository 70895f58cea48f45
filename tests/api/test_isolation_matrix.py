"""The isolation matrix, generated from the URL configuration: for every tenant endpoint and
method, every member role of tenant A and every token of A gets 403/404 (never data) for
tenant B's objects; viewers (and admins, where owners are required) cannot write; nobody but
staff reaches the operator endpoints. A new endpoint joins the matrix by existing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import URLPattern
from rest_framework.test import APIClient

from apps.tenants.models import Membership
from config.urls import ops_urls, tenant_urls
from tests.api.conftest import World, callers_of, session_client, token_client

pytestmark = pytest.mark.db

METHODS = ("get", "post", "put", "patch", "delete")
WRITE_METHODS = ("post", "put", "patch", "delete")
ROLE_RANK = {"viewer": 0, "admin": 1, "owner": 2}


def _methods(pattern: URLPattern) -> list[str]:
    view_class = pattern.callback.view_class  # type: ignore[attr-defined]
    return [m for m in METHODS if hasattr(view_class, m)]


def _view(pattern: URLPattern) -> Any:
    return pattern.callback.view_class  # type: ignore[attr-defined]


def _route_methods(route: str, patterns: list[Any]) -> list[str]:
    return _methods(next(p for p in patterns if str(p.pattern) == route))


def _tenant_cases() -> list[tuple[str, str]]:
    return [(str(p.pattern), m) for p in tenant_urls for m in _methods(p)]


def _ops_cases() -> list[tuple[str, str]]:
    return [(str(p.pattern), m) for p in ops_urls for m in _methods(p)]


def _fill(route: str, **values: str) -> str:
    for name, value in values.items():
        for converter in ("str", "slug", "int"):
            route = route.replace(f"<{converter}:{name}>", value)
    assert "<" not in route, route
    return route


def _call(client: APIClient, method: str, url: str) -> Any:
    return getattr(client, method)(url, data={}, format="json", HTTP_IF_MATCH="*")


def _secrets_of_b(world: World) -> list[str]:
    b = world.b
    strings = [b.tenant.slug, b.tenant.name, b.key.prefix, *b.event_ids]
    strings += [token.prefix for token, _secret in b.tokens.values()]
    return strings


def _assert_refused(response: Any, world: World, what: str) -> None:
    assert response.status_code in (403, 404), (what, response.status_code, response.content)
    body = response.content.decode()
    for secret in _secrets_of_b(world):
        assert secret not in body, (what, secret, body)
    assert set(json.loads(body)) == {"error"}, body


def _b_object(route: str, world: World) -> dict[str, str]:
    """Path values naming tenant B's objects for a route."""
    b_token = world.b.tokens["viewer"][0].prefix
    return {
        "prefix": b_token if route.startswith("tokens/") else world.b.key.prefix,
        "period": "day",
    }


@pytest.mark.parametrize("route", [str(p.pattern) for p in tenant_urls])
def test_members_and_tokens_of_a_never_reach_b(world: World, route: str) -> None:
    url = f"/api/v1/tenants/{world.b.tenant.slug}/" + _fill(route, **_b_object(route, world))
    for label, _role, client in callers_of(world.a):
        for method in _route_methods(route, tenant_urls):
            _assert_refused(_call(client, method, url), world, f"{label} {method} {url}")


@pytest.mark.parametrize(
    ("route", "method"), [c for c in _tenant_cases() if "<str:prefix>" in c[0]]
)
def test_b_objects_under_a_own_slug_are_not_found(world: World, route: str, method: str) -> None:
    url = f"/api/v1/tenants/{world.a.tenant.slug}/" + _fill(route, **_b_object(route, world))
    for label, role, client in callers_of(world.a):
        response = _call(client, method, url)
        allowed = ROLE_RANK[role] >= ROLE_RANK[_needed_role(route, method)]
        expected = (404,) if allowed else (403, 404)
        assert response.status_code in expected, (label, url, response.content)
        _assert_refused(response, world, f"{label} {method} {url}")


def _needed_role(route: str, method: str) -> str:
    pattern = next(p for p in tenant_urls if str(p.pattern) == route)
    view = _view(pattern)
    if method == "get":
        return str(getattr(view, "read_role", Membership.Role.VIEWER))
    return str(getattr(view, "write_role", Membership.Role.ADMIN))


@pytest.mark.parametrize(("route", "method"), [c for c in _tenant_cases() if c[1] in WRITE_METHODS])
def test_roles_below_the_write_role_cannot_write(world: World, route: str, method: str) -> None:
    url = f"/api/v1/tenants/{world.a.tenant.slug}/" + _fill(
        route, prefix=world.a.key.prefix, period="day"
    )
    needed = _needed_role(route, method)
    weaker = [role for role in ("viewer", "admin") if ROLE_RANK[role] < ROLE_RANK[needed]]
    assert weaker, f"{route} {method}: every write needs at least admin"
    for role in weaker:
        for client in (
            session_client(world.a.users[role]),
            token_client(world.a.tokens[role][1]),
        ):
            response = _call(client, method, url)
            assert response.status_code == 403, (role, method, url, response.content)
            assert response.json()["error"]["code"] == "permission_denied"


@pytest.mark.parametrize("route", [str(p.pattern) for p in ops_urls])
def test_tenant_callers_never_reach_operator_endpoints(world: World, route: str) -> None:
    url = "/api/v1/ops/" + _fill(
        route,
        slug=world.b.tenant.slug,
        name="standard",
        pk=str(world.model.pk),
        period="day",
        task_id="some-task",
    )
    callers = callers_of(world.a)
    for method in _route_methods(route, ops_urls):
        for label, _role, client in callers:
            _assert_refused(_call(client, method, url), world, f"{label} {method} {url}")
        anonymous = _call(APIClient(), method, url)
        assert anonymous.status_code in (401, 403), anonymous.content
        # The inference key is no credential for the REST API at all.
        inference = _call(token_client(world.a.key_secret), method, url)
        assert inference.status_code == 401, inference.content


def test_the_matrix_covers_every_endpoint() -> None:
    assert len(_tenant_cases()) >= 18
    assert len(_ops_cases()) >= 48
    actions = ("start", "advance", "pause", "resume", "promote", "rollback")
    rollout_actions = {(f"rollouts/<int:pk>/{action}/", "post") for action in actions}
    assert rollout_actions <= set(_ops_cases())
    scaling = {
        ("pools/<int:pk>/scaling/", "get"),
        ("pools/<int:pk>/scaling/", "patch"),
        ("pools/<int:pk>/scaling/decisions/", "get"),
    }
    assert scaling <= set(_ops_cases())


def test_filters_naming_b_objects_return_nothing_of_b(world: World) -> None:
    base = f"/api/v1/tenants/{world.a.tenant.slug}"
    client = token_client(world.a.tokens["viewer"][1])
    b_key = world.b.key.prefix
    records = client.get(f"{base}/usage/", {"key": b_key}).json()
    assert records["results"] == []
    summary = client.get(f"{base}/usage/summary/", {"key": b_key, "group_by": "key"}).json()
    assert summary["rows"] == []
    b_target = str(world.b.tenant.pk)
    audit = client.get(f"{base}/audit/", {"target_type": "tenants.tenant", "target_id": b_target})
    assert audit.json()["results"] == []
    export = client.get(f"{base}/usage/export.csv", {"key": b_key})
    assert b"".join(export.streaming_content).decode().count("\n") == 1  # the header only
