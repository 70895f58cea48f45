"""Every way a request can be refused: status, OpenAI error shape, and nothing changed.

One table drives the test; each row is sent through the real router to real simulators.
Rows that must be refused before dispatch also check that no simulator saw any work.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import openai
import pytest
from gateway_fleet import (
    CHAT_MODEL,
    EMBED_MODEL,
    GHOST_MODEL,
    ORPHAN_MODEL,
    SLOW_MODEL,
    Fleet,
    http_get,
    metric_value,
    new_key,
)

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "hello"}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
MiB = 1 << 20


@dataclass(frozen=True)
class Row:
    id: str
    status: int
    type: str
    code: str
    body: Any = None  # dict → JSON; bytes → as is
    key: str | None = "good"  # a fleet key name; None: no Authorization header
    path: str = CHAT
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    param: str | None = None
    reaches_upstream: bool = False


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": CHAT_MODEL, "messages": MESSAGES} | extra


UNKNOWN_KEY = new_key()[0]

ROWS = [
    Row("malformed_json", 400, "invalid_request_error", "invalid_json", body=b'{"model": '),
    Row("not_utf8", 400, "invalid_request_error", "invalid_json", body=b"\xff\xfe{}"),
    Row("bad_utf8_in_a_string", 400, "invalid_request_error", "invalid_json",
        body=b'{"model": "sim-chat", "messages": [{"role": "user", "content": "\xc3\x28"}]}'),
    Row("missing_field", 400, "invalid_request_error", "invalid_value",
        body={"model": CHAT_MODEL}, param="messages"),
    Row("wrong_type", 400, "invalid_request_error", "invalid_value",
        body=chat(max_tokens="ten"), param="max_tokens"),
    Row("out_of_range", 400, "invalid_request_error", "invalid_value",
        body=chat(temperature=-0.5), param="temperature"),
    Row("n_out_of_range", 400, "invalid_request_error", "invalid_value", body=chat(n=0),
        param="n"),
    Row("missing_role", 400, "invalid_request_error", "invalid_value",
        body={"model": CHAT_MODEL, "messages": [{"content": "x"}]}, param="messages[0].role"),
    Row("empty_messages", 400, "invalid_request_error", "invalid_value",
        body={"model": CHAT_MODEL, "messages": []}, param="messages"),
    Row("mixed_prompt_batch", 400, "invalid_request_error", "invalid_value", path=COMPLETIONS,
        body={"model": CHAT_MODEL, "prompt": ["a", [1, 2]]}, param="prompt"),
    Row("not_an_object", 400, "invalid_request_error", "invalid_value", body=b"[1, 2]"),
    Row("missing_key", 401, "authentication_error", "missing_api_key", body=chat(), key=None),
    Row("not_bearer", 401, "authentication_error", "missing_api_key", body=chat(), key=None,
        headers={"Authorization": "Basic dXNlcjpwYXNz"}),
    Row("unknown_key", 401, "authentication_error", "invalid_api_key", body=chat(), key=None,
        headers={"Authorization": f"Bearer {UNKNOWN_KEY}"}),
    Row("garbage_key", 401, "authentication_error", "invalid_api_key", body=chat(), key=None,
        headers={"Authorization": "Bearer sk-not-ours"}),
    Row("wrong_secret", 401, "authentication_error", "invalid_api_key", body=chat(),
        key="good:tampered"),
    Row("expired_key", 401, "authentication_error", "expired_api_key", body=chat(),
        key="expired"),
    Row("suspended_tenant", 403, "permission_error", "tenant_suspended", body=chat(),
        key="frozen"),
    Row("insufficient_scope", 403, "permission_error", "insufficient_scope", body=chat(),
        key="readonly"),
    Row("model_not_allowed", 403, "permission_error", "model_not_allowed", body=chat(),
        key="narrow", param="model"),
    Row("class_not_allowed", 403, "permission_error", "class_not_allowed", body=chat(),
        headers={"X-Switchyard-Class": "secret-class"}, param="X-Switchyard-Class"),
    Row("unknown_class", 403, "permission_error", "class_not_allowed", body=chat(),
        headers={"X-Switchyard-Class": "no-such-class"}, param="X-Switchyard-Class"),
    Row("unknown_model", 404, "invalid_request_error", "model_not_found",
        body={"model": "no-such-model", "messages": MESSAGES}, param="model"),
    Row("wrong_route_for_model", 400, "invalid_request_error", "unsupported_model_task",
        path=EMBEDDINGS, body={"model": CHAT_MODEL, "input": "x"}, param="model"),
    Row("chat_on_embedding_model", 400, "invalid_request_error", "unsupported_model_task",
        body={"model": EMBED_MODEL, "messages": MESSAGES}, param="model"),
    Row("body_over_cap", 413, "invalid_request_error", "request_too_large",
        body=b"{" + b" " * (MiB + 1) + b"}"),
    Row("max_tokens_over_cap", 400, "invalid_request_error", "max_tokens_exceeded",
        body=chat(max_tokens=17), key="tiny", param="max_tokens"),
    Row("n_times_max_tokens_over_cap", 400, "invalid_request_error", "max_tokens_exceeded",
        body=chat(max_tokens=9, n=2), key="tiny", param="max_tokens"),
    Row("max_completion_tokens_over_cap", 400, "invalid_request_error", "max_tokens_exceeded",
        body=chat(max_completion_tokens=17), key="tiny", param="max_completion_tokens"),
    Row("context_over_cap", 400, "invalid_request_error", "context_length_exceeded",
        body={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "y" * 60}],
              "max_tokens": 10},
        key="tiny", param="messages"),
    Row("context_over_cap_default_max_tokens", 400, "invalid_request_error",
        "context_length_exceeded", path=COMPLETIONS,
        body={"model": CHAT_MODEL, "prompt": "z" * 80}, key="tiny", param="prompt"),
    Row("embedding_input_over_cap", 400, "invalid_request_error", "context_length_exceeded",
        path=EMBEDDINGS, body={"model": EMBED_MODEL, "input": ["ok", "w" * 100]}, key="tiny",
        param="input[1]"),
    Row("bad_timeout_header", 400, "invalid_request_error", "invalid_header", body=chat(),
        headers={"X-Request-Timeout": "soon"}, param="X-Request-Timeout"),
    Row("tiny_timeout_header", 400, "invalid_request_error", "invalid_header", body=chat(),
        headers={"X-Request-Timeout": "0.0001"}, param="X-Request-Timeout"),
    Row("engine_refuses_n", 400, "invalid_request_error", "upstream_rejected",
        body=chat(n=2), param="n", reaches_upstream=True),
    Row("no_healthy_endpoint_closed_port", 503, "server_error", "no_healthy_endpoint",
        body={"model": GHOST_MODEL, "messages": MESSAGES}),
    Row("no_endpoint_at_all", 503, "server_error", "no_healthy_endpoint",
        body={"model": ORPHAN_MODEL, "messages": MESSAGES}),
    Row("deadline_exceeded", 504, "timeout_error", "deadline_exceeded",
        body={"model": SLOW_MODEL, "messages": [{"role": "user", "content": "s" * 400}],
              "max_tokens": 4, "stream": True},
        headers={"X-Request-Timeout": "0.3"}, reaches_upstream=True),
    Row("upstream_refusal_passed_back", 400, "invalid_request_error", "upstream_rejected",
        key="roomy", body=chat(messages=[{"role": "user", "content": "q " * 9000}], max_tokens=8),
        reaches_upstream=True),
    Row("method_not_allowed", 405, "invalid_request_error", "method_not_allowed", method="GET"),
    Row("unknown_url", 404, "invalid_request_error", "unknown_url", path="/v1/nothing-here"),
]  # fmt: skip


def work_done(fleet: Fleet) -> tuple[float, ...]:
    """Counters that move when a simulator does any work at all."""
    values: list[float] = []
    for name in ("chat-a", "chat-b", "embed"):
        _, body = http_get(f"{fleet.sims[name].base_url}/metrics")
        text = body.decode()
        values += [
            metric_value(text, "vllm:prompt_tokens_total") or 0.0,
            metric_value(text, "vllm:request_success_total") or 0.0,
        ]
    return tuple(values)


def headers_for(fleet: Fleet, row: Row) -> dict[str, str]:
    headers = dict(row.headers)
    if row.key is not None:
        name, _, tamper = row.key.partition(":")
        key = fleet.key(name)
        if tamper:
            key = key[:-1] + ("A" if key[-1] != "A" else "B")
        headers["Authorization"] = f"Bearer {key}"
    return headers


def send(fleet: Fleet, row: Row) -> httpx.Response:
    kwargs: dict[str, Any] = {"headers": headers_for(fleet, row), "timeout": 30}
    if isinstance(row.body, bytes):
        kwargs["content"] = row.body
    elif row.body is not None:
        kwargs["json"] = row.body
    return httpx.request(row.method, f"{fleet.base_url}{row.path}", **kwargs)


def assert_openai_error(resp: httpx.Response, status: int, type_: str, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["x-request-id"]
    document = resp.json()
    assert list(document) == ["error"]
    error = document["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["type"] == type_
    assert error["code"] == code
    return error  # type: ignore[no-any-return]


@pytest.fixture
def quiet(fleet: Fleet) -> Iterator[None]:
    """Assert (after the test) that no simulator did any work during it."""
    before = work_done(fleet)
    yield
    assert work_done(fleet) == before


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_refusals(fleet: Fleet, row: Row) -> None:
    before = work_done(fleet)
    started = time.monotonic()
    resp = send(fleet, row)
    error = assert_openai_error(resp, row.status, row.type, row.code)
    if row.param is not None:
        assert error["param"] == row.param
    if not row.reaches_upstream:
        assert work_done(fleet) == before, "a refused request reached a simulator"
    if row.code == "deadline_exceeded":
        assert time.monotonic() - started < 3.0  # refused at the deadline, not at the TTFT
    if row.path in {CHAT, COMPLETIONS, EMBEDDINGS}:
        _, metrics = http_get(f"{fleet.base_url}/metrics")
        assert f'outcome="{row.code}"' in metrics.decode()  # counted by outcome


def test_chunked_body_over_cap_without_content_length(fleet: Fleet, quiet: None) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(24):
            yield b" " * (64 * 1024)

    resp = httpx.post(
        f"{fleet.base_url}{CHAT}",
        content=chunks(),
        headers={"Authorization": f"Bearer {fleet.key('good')}"},
        timeout=30,
    )
    assert "content-length" not in resp.request.headers
    assert_openai_error(resp, 413, "invalid_request_error", "request_too_large")


def test_a_revoked_key_stops_working_on_the_next_snapshot(fleet: Fleet) -> None:
    key = fleet.world.add_key("short-lived", "acme")
    fleet.republish()
    headers = {"Authorization": f"Bearer {key}"}
    ok = httpx.post(f"{fleet.base_url}{CHAT}", json=chat(max_tokens=1), headers=headers, timeout=30)
    assert ok.status_code == 200
    prefix = key.split("_")[1]
    del fleet.world.keys[prefix]  # what api_key_revoke + publish does to the snapshot
    fleet.republish()
    gone = httpx.post(f"{fleet.base_url}{CHAT}", json=chat(), headers=headers, timeout=30)
    assert_openai_error(gone, 401, "authentication_error", "invalid_api_key")


@pytest.mark.parametrize(
    ("key", "model", "extra", "exc", "code"),
    [
        ("expired", CHAT_MODEL, {}, openai.AuthenticationError, "expired_api_key"),
        ("frozen", CHAT_MODEL, {}, openai.PermissionDeniedError, "tenant_suspended"),
        ("good", "no-such-model", {}, openai.NotFoundError, "model_not_found"),
        ("tiny", CHAT_MODEL, {"max_tokens": 99}, openai.BadRequestError, "max_tokens_exceeded"),
        ("good", CHAT_MODEL, {"n": 0}, openai.BadRequestError, "invalid_value"),
        ("good", CHAT_MODEL, {"temperature": -1}, openai.BadRequestError, "invalid_value"),
        ("good", GHOST_MODEL, {}, openai.InternalServerError, "no_healthy_endpoint"),
    ],
)
def test_the_openai_client_raises_the_matching_error(
    fleet: Fleet, key: str, model: str, extra: dict[str, Any], exc: type[Exception], code: str
) -> None:
    client = openai.OpenAI(base_url=f"{fleet.base_url}/v1", api_key=fleet.key(key), max_retries=0)
    with pytest.raises(exc) as info:
        client.chat.completions.create(model=model, messages=MESSAGES, **extra)  # type: ignore[call-overload]
    assert getattr(info.value, "code", None) == code


def test_an_operator_refused_field_is_400_unsupported_parameter(fleet: Fleet) -> None:
    """``Model.refused_fields`` reaches the router in the snapshot; other fields still pass."""
    original = fleet.world.models[CHAT_MODEL]
    fleet.world.models[CHAT_MODEL] = msgspec.structs.replace(
        original, refused_fields=("logit_bias", "top_k")
    )
    fleet.republish()
    headers = {"Authorization": f"Bearer {fleet.key('good')}"}
    try:
        before = work_done(fleet)
        for field, value in (("logit_bias", {"1": -100}), ("top_k", 5)):
            resp = httpx.post(
                f"{fleet.base_url}{CHAT}", json=chat(**{field: value}), headers=headers, timeout=30
            )
            error = assert_openai_error(resp, 400, "invalid_request_error", "unsupported_parameter")
            assert error["param"] == field
            assert field in error["message"]
        assert work_done(fleet) == before
        ok = httpx.post(
            f"{fleet.base_url}{CHAT}",
            json=chat(max_tokens=2, min_p=0.1, tools=[]),
            headers=headers,
            timeout=30,
        )
        assert ok.status_code == 200, ok.text
    finally:
        fleet.world.models[CHAT_MODEL] = original
        fleet.republish()
