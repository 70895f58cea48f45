"""Schemathesis against the live schema, in-process through the WSGI app: for every
operation, generated requests (a bounded number) never get a 5xx, and every response
conforms to the schema (status code documented, content type, body schema).

Tenant operations run as tenant A's owner token with the real tenant slug; operator
operations as a staff session (with a CSRF token, so writes reach the services).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.middleware.csrf import _get_new_csrf_string
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import World, session_client

pytestmark = pytest.mark.db

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
MAX_EXAMPLES = int(os.environ.get("SWITCHYARD_API_FUZZ_EXAMPLES", "6"))  # per operation


def _pin_path(case: Any, world: World) -> None:
    """Point path parameters at real objects often enough to reach the happy paths."""
    params = case.path_parameters or {}
    path = case.path
    if "tenant" in params:
        params["tenant"] = world.a.tenant.slug
    if "prefix" in params and "/api-keys/" in path:
        params["prefix"] = world.a.key.prefix
    if "slug" in params:
        params["slug"] = world.b.tenant.slug
    if "period" in params and "budgets" in path:
        params["period"] = "day"
    if "pk" in params:
        ids = {
            "/models/": world.model.pk,
            "/versions/": world.version.pk,
            "/pools/": world.pool.pk,
            "/routes/": world.model.pk,
        }
        for fragment, pk in ids.items():
            if fragment in path:
                params["pk"] = pk


def _fuzz(operation: Any, headers: dict[str, str], cookies: dict[str, str], world: World) -> None:
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(), pin=st.booleans())
    def run(case: Any, pin: bool) -> None:
        if pin:
            _pin_path(case, world)
        response = case.call(headers=headers, cookies=cookies)
        case.validate_response(response, checks=CHECKS, headers=headers)

    run()


@pytest.fixture
def keep_test_connection() -> Iterator[None]:
    """Like Django's test client: requests must not close the test transaction's connection."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.mark.timing
@pytest.mark.usefixtures("keep_test_connection")
def test_every_operation_conforms_and_never_5xx(world: World) -> None:
    app = get_wsgi_application()
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", app)
    staff = session_client(world.staff)
    session_id = staff.cookies["sessionid"].value
    csrf = _get_new_csrf_string()
    owner_token = world.a.tokens["owner"][1]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 55
    for operation in operations:
        is_ops = operation.path.startswith("/api/v1/ops/")
        if is_ops:
            headers = {"X-CSRFToken": csrf}
            cookies = {"sessionid": session_id, "csrftoken": csrf}
        else:
            headers, cookies = {"Authorization": f"Bearer {owner_token}"}, {}
        _fuzz(operation, headers, cookies, world)
