"""Cross-cutting conventions: throttling per credential, the error shape, the schema itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from tests.api.conftest import World, token_client

pytestmark = pytest.mark.db


def test_throttling_is_per_credential(world: World, settings: Any) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"api": "3/min"},
    }
    first = token_client(world.a.tokens["viewer"][1])
    statuses = [first.get("/api/v1/tenants/acme/").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    throttled = first.get("/api/v1/tenants/acme/")
    assert throttled.json()["error"]["code"] == "throttled"
    assert int(throttled["Retry-After"]) > 0
    # Another token of the same tenant has its own bucket.
    assert token_client(world.a.tokens["admin"][1]).get("/api/v1/tenants/acme/").status_code == 200


def test_unknown_api_url_and_method_use_the_error_shape(world: World) -> None:
    client = token_client(world.a.tokens["owner"][1])
    missing = client.get("/api/v1/nothing-here/")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"code": "not_found", "message": "No such endpoint or object."}
    }
    wrong = client.delete("/api/v1/tenants/acme/")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    garbage = client.post(
        "/api/v1/tenants/acme/api-keys/", data="{nope", content_type="application/json"
    )
    assert garbage.status_code == 400
    assert garbage.json()["error"]["code"] == "parse_error"


def test_schema_is_complete_and_generates_without_warnings(tmp_path: Path) -> None:
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    schema = yaml.safe_load(out.read_text())
    schemes = schema["components"]["securitySchemes"]
    assert set(schemes) == {"cookieAuth", "managementToken"}
    operations = [
        (path, method, op)
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]
    assert len(operations) >= 60
    for path, method, op in operations:
        where = f"{method.upper()} {path}"
        assert op.get("operationId"), where
        assert op.get("tags"), where
        assert any(code.startswith("2") for code in op["responses"]), where
        assert op["responses"]["403"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }, where
        if method == "patch":
            headers = [p["name"] for p in op.get("parameters", []) if p["in"] == "header"]
            assert "If-Match" in headers, where
    issued = schema["paths"]["/api/v1/tenants/{tenant}/api-keys/"]["post"]["responses"]["201"]
    assert "examples" in issued["content"]["application/json"]
