"""Config from the environment, the error table, class/deadline resolution, terminal chunks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from gateway_fleet import World

from runtime.gateway.admit import _LIMIT_CODES
from runtime.gateway.config import ConfigError, RouterConfig
from runtime.gateway.errors import ERROR_KINDS, ApiError, error_body, upstream_refusal
from runtime.gateway.relay import _Meta, broken_error, terminal_error_chunk
from runtime.gateway.resolve import resolve_class, resolve_model, resolve_timeout
from runtime.gateway.upstream_errors import dispatch_error
from runtime.scheduling.interfaces import DropReason
from runtime.upstream.errors import (
    ConnectFailed,
    DeadlineExceeded,
    FirstByteTimeout,
    NoEndpointAvailable,
    StreamBroken,
    UpstreamHTTPError,
)

pytestmark = pytest.mark.unit


def test_config_from_env() -> None:
    config = RouterConfig.from_env(
        {
            "REDIS_URL": "redis://r:1/2",
            "SWITCHYARD_SNAPSHOT_PREFIX": "p",
            "SWITCHYARD_VAR_DIR": "/tmp/x",
            "SWITCHYARD_MAX_BODY_BYTES": "2048",
            "SWITCHYARD_RETRY_ATTEMPTS": "5",
            "SWITCHYARD_TTFT_TIMEOUT_S": "2.5",
            "SWITCHYARD_KEY_USAGE_HASH": "h",
        }
    )
    assert config.key_usage_hash == "h"
    assert config.redis_url == "redis://r:1/2"
    assert config.snapshot_prefix == "p"
    assert config.snapshot_cache_path == Path("/tmp/x/router-snapshot.json")
    assert (config.max_body_bytes, config.retry_attempts, config.ttft_timeout_s) == (2048, 5, 2.5)
    defaults = RouterConfig.from_env({})
    assert defaults.snapshot_prefix == "switchyard:snapshot"
    assert defaults.snapshot_cache_path == Path("var/router-snapshot.json")
    assert defaults.max_body_bytes == 1 << 20
    assert defaults.key_usage_hash == "switchyard:apikey:last_used"


@pytest.mark.parametrize(
    "env",
    [
        {"SWITCHYARD_MAX_BODY_BYTES": "lots"},
        {"SWITCHYARD_RETRY_ATTEMPTS": "0"},
        {"SWITCHYARD_TTFT_TIMEOUT_S": "-1"},
        {"SWITCHYARD_MAX_DEADLINE_S": "10"},  # below the default deadline
        {"SWITCHYARD_CLIENT_WRITE_STALL_S": "0"},
    ],
)
def test_bad_config_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        RouterConfig.from_env(env)


def test_every_error_kind_renders_the_openai_shape() -> None:
    for code, kind in ERROR_KINDS.items():
        fields: dict[str, Any] = {name: f"<{name}>" for name in kind.fields()}
        if "status" in fields:  # the engine's status, passed back (upstream_rejected)
            fields["status"] = 418
        error = ApiError.of(code, **fields)
        assert error.status == (418 if kind.passthrough_status else kind.status)
        assert "{" not in error.message
        assert json.loads(error.body()) == {
            "error": {
                "message": kind.template.format_map(fields),
                "type": kind.type,
                "param": fields.get("param"),
                "code": code,
            }
        }
        override = ApiError.of(code, "msg", param="p")
        assert (override.message, override.param, override.status) == ("msg", "p", kind.status)
    assert json.loads(error_body("m", type="t", code=None)) == {
        "error": {"message": "m", "type": "t", "param": None, "code": None}
    }


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (b'{"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}',
         "too long", None),
        (b'{"error": {"message": "nope", "type": "x", "param": "max_tokens", "code": "c"}}',
         "nope", "max_tokens"),
        (b"not json", "The model server refused the request (HTTP 400).", None),
        (b'["odd"]', "The model server refused the request (HTTP 400).", None),
        (b'{"message": "\xff"}', "The model server refused the request (HTTP 400).", None),
    ],
)  # fmt: skip
def test_upstream_refusals_keep_their_message(body: bytes, message: str, param: str | None) -> None:
    error = upstream_refusal(400, body)
    assert (error.status, error.message, error.param, error.code) == (
        400, message, param, "upstream_rejected",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (DeadlineExceeded("x"), 504, "deadline_exceeded"),
        (NoEndpointAvailable("x"), 503, "no_healthy_endpoint"),
        (ConnectFailed("x"), 503, "no_healthy_endpoint"),
        (FirstByteTimeout("x"), 504, "upstream_timeout"),
        (UpstreamHTTPError(429, b""), 503, "no_healthy_endpoint"),
        (UpstreamHTTPError(500, b"boom"), 502, "upstream_error"),
        (UpstreamHTTPError(422, b'{"message": "bad"}'), 422, "upstream_rejected"),
    ],
)
def test_dispatch_errors(error: Exception, status: int, code: str) -> None:
    api = dispatch_error(error, model="m")  # type: ignore[arg-type]
    assert (api.status, api.code) == (status, code)


@pytest.fixture
def world() -> World:
    world = World()
    world.add_class("interactive", band=0, deadline_ms=2000)
    world.add_class("batch", band=2, deadline_ms=90_000)
    world.add_tenant("acme", classes=("interactive", "batch"), default_class="interactive")
    world.add_tenant("plain")
    world.add_tenant("picky", models=("m",))
    world.add_model("m", 1)
    world.add_model("e", 2, task="embedding")
    return world


def test_resolve_class(world: World) -> None:
    snap = world.snapshot()
    acme, plain = snap.tenants["acme"], snap.tenants["plain"]
    assert resolve_class(snap, acme, None).name == "interactive"  # type: ignore[union-attr]
    assert resolve_class(snap, acme, b" batch ").name == "batch"  # type: ignore[union-attr]
    assert resolve_class(snap, plain, None) is None
    for tenant, header in ((plain, b"batch"), (acme, b"nope")):
        with pytest.raises(ApiError) as info:
            resolve_class(snap, tenant, header)
        assert info.value.code == "class_not_allowed"


def test_resolve_timeout(world: World) -> None:
    snap = world.snapshot()
    config = RouterConfig()
    interactive = snap.classes["interactive"]
    assert resolve_timeout(interactive, None, config) == 2.0
    assert resolve_timeout(interactive, b"0.5", config) == 0.5
    assert resolve_timeout(interactive, b"60", config) == 2.0
    assert resolve_timeout(None, None, config) == config.default_deadline_s
    assert resolve_timeout(None, b"100000", config) == config.default_deadline_s
    assert resolve_timeout(interactive, b"0.05", config) == 0.05
    for bad in (b"0", b"0.0001", b"0.049", b"-1", b"nan", b"inf", b"-inf", b"soon", b"", b"1e"):
        with pytest.raises(ApiError) as info:
            resolve_timeout(interactive, bad, config)
        assert info.value.code == "invalid_header"


def test_resolve_model(world: World) -> None:
    snap = world.snapshot()
    picky = snap.tenants["picky"]
    assert resolve_model(snap, picky, "m", tasks={"chat"}, route="/r").name == "m"
    cases = [("zzz", {"chat"}, "model_not_found"), ("e", {"embedding"}, "model_not_allowed")]
    cases.append(("m", {"embedding"}, "unsupported_model_task"))
    for name, tasks, code in cases:
        with pytest.raises(ApiError) as info:
            resolve_model(snap, picky, name, tasks=tasks, route="/r")
        assert info.value.code == code


CHAT_END = {"index": 0, "finish_reason": "error", "delta": {}}
TEXT_END = {"index": 0, "finish_reason": "error", "text": ""}


@pytest.mark.parametrize(
    ("kind", "reason", "expected_choice", "code"),
    [
        ("chat", "disconnected", CHAT_END, "stream_broken"),
        ("completion", "truncated", TEXT_END, "stream_broken"),
        ("chat", "deadline", CHAT_END, "deadline_exceeded"),
        ("chat", "", CHAT_END, "router_shutdown"),  # the router cuts it at the grace's end
        ("completion", "", TEXT_END, "router_shutdown"),
    ],
)
def test_terminal_error_chunk(
    kind: str, reason: str, expected_choice: dict[str, object], code: str
) -> None:
    failure = broken_error(StreamBroken("x", reason=reason)) if reason else ApiError.of(code)
    chunk = json.loads(terminal_error_chunk(kind, _Meta(id="c1", created=5, model="m"), failure))
    assert chunk["id"] == "c1"
    assert chunk["created"] == 5
    assert chunk["object"] == ("chat.completion.chunk" if kind == "chat" else "text_completion")
    assert chunk["choices"] == [expected_choice]
    assert chunk["error"]["code"] == code
    kind = ERROR_KINDS[code]
    assert chunk["error"]["type"] == kind.type
    assert set(chunk["error"]) == {"message", "type", "param", "code"}


GATEWAY = Path(__file__).resolve().parents[3] / "runtime" / "gateway"
_NAMED_CODE = re.compile(r"""ApiError\.of\(\s*["']([a-z_]+)["']|\bcode=["']([a-z_]+)["']""")
_DIRECT = re.compile(r"(?<![.\w])ApiError\(")


def test_every_code_the_gateway_can_emit_is_in_the_table() -> None:
    """Codes named in the source, the limits' and the queue's codes (raised by variable),
    and no error built around the table (``ApiError(...)`` outside errors.py)."""
    named: set[str] = set()
    for source in sorted(GATEWAY.glob("*.py")):
        text = source.read_text()
        named |= {a or b for a, b in _NAMED_CODE.findall(text)}
        if source.name != "errors.py":
            assert not _DIRECT.search(text), f"{source.name} builds an ApiError by hand"
    assert len(named) > 20  # the scan found the raises
    dynamic = set(_LIMIT_CODES.values()) | {
        str(DropReason.QUEUE_FULL),
        str(DropReason.WAIT_EXCEEDS_DEADLINE),
        str(DropReason.SHED),
    }
    assert named | dynamic <= set(ERROR_KINDS), (named | dynamic) - set(ERROR_KINDS)
    assert {"stream_broken", "upstream_rejected", "unsupported_parameter"} <= named
    assert 422 not in {kind.status for kind in ERROR_KINDS.values()}  # OpenAI uses 400


def test_an_unknown_code_fails_at_the_raise() -> None:
    with pytest.raises(KeyError):
        ApiError.of("no_such_code")
