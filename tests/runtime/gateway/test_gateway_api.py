"""The OpenAI API through the router, driven by the official ``openai`` client and raw HTTP."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from gateway_fleet import CHAT_MODEL, EMBED_MODEL, GHOST_MODEL, ORPHAN_MODEL, SLOW_MODEL, Fleet

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "Tell me about rail yards"}]


@pytest.fixture
def client(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleet.base_url}/v1", api_key=fleet.key("good"), max_retries=0)


def sse_payloads(raw: str) -> list[str]:
    """The data payloads of an SSE body, checking OpenAI's framing on the way."""
    assert raw.endswith("\n\n")
    events = raw[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: "), event
        assert "\n" not in event
    return [event[len("data: ") :] for event in events]


def test_chat_unary(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=CHAT_MODEL, messages=MESSAGES, max_tokens=6
    )
    result = raw.parse()
    assert raw.headers["x-request-id"]
    assert raw.headers["content-type"] == "application/json"
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None
    assert result.usage.completion_tokens == 6


def test_chat_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, max_tokens=5, stream=True
        )
    )
    assert chunks
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert len(text.split()) == 5


def test_chat_stream_with_include_usage_ends_with_the_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_chat_stream_raw_sse_framing(fleet: Fleet) -> None:
    body = {"model": CHAT_MODEL, "messages": MESSAGES, "max_tokens": 3, "stream": True}
    resp = httpx.post(
        f"{fleet.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {fleet.key('good')}"},
        timeout=30,
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["cache-control"] == "no-cache"
    payloads = sse_payloads(resp.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_completions_unary_and_stream(client: openai.OpenAI) -> None:
    result = client.completions.create(model=CHAT_MODEL, prompt="Once upon a time", max_tokens=4)
    assert result.object == "text_completion"
    assert len(result.choices[0].text.split()) == 4
    assert result.usage is not None
    assert result.usage.completion_tokens == 4

    plain = list(
        client.completions.create(model=CHAT_MODEL, prompt="Once", max_tokens=4, stream=True)
    )
    assert all(chunk.usage is None for chunk in plain)
    with_usage = list(
        client.completions.create(
            model=CHAT_MODEL,
            prompt="Once",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert with_usage[-1].usage is not None
    assert with_usage[-1].usage.completion_tokens == 4
    assert with_usage[-1].choices == []


def test_embeddings(client: openai.OpenAI) -> None:
    single = client.embeddings.create(model=EMBED_MODEL, input="a rail yard")
    assert len(single.data) == 1
    assert len(single.data[0].embedding) == 16
    batch = client.embeddings.create(
        model=EMBED_MODEL, input=["one", "two", "three"], encoding_format="float"
    )
    assert [d.index for d in batch.data] == [0, 1, 2]
    assert batch.usage.prompt_tokens > 0


def test_models_lists_what_the_tenant_may_use(fleet: Fleet, client: openai.OpenAI) -> None:
    names = sorted(m.id for m in client.models.list())
    assert names == sorted([CHAT_MODEL, EMBED_MODEL, SLOW_MODEL, GHOST_MODEL, ORPHAN_MODEL])
    narrow = openai.OpenAI(
        base_url=f"{fleet.base_url}/v1", api_key=fleet.key("narrow"), max_retries=0
    )
    assert [m.id for m in narrow.models.list()] == [EMBED_MODEL]
    assert narrow.models.retrieve(EMBED_MODEL).id == EMBED_MODEL
    with pytest.raises(openai.NotFoundError):
        narrow.models.retrieve(CHAT_MODEL)


def test_models_needs_a_key(fleet: Fleet) -> None:
    resp = httpx.get(f"{fleet.base_url}/v1/models", timeout=10)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "missing_api_key"


def test_request_class_header_selects_an_entitled_class(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=MESSAGES,
        max_tokens=2,
        extra_headers={"X-Switchyard-Class": "batch"},
    )
    assert result.choices[0].message.content


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [("client-req-42", True), ("bad id with spaces", False), ("x" * 200, False)],
)
def test_request_id_is_echoed_or_generated(fleet: Fleet, sent: str, echoed: bool) -> None:
    resp = httpx.post(
        f"{fleet.base_url}/v1/chat/completions",
        json={"model": CHAT_MODEL, "messages": MESSAGES, "max_tokens": 1},
        headers={"Authorization": f"Bearer {fleet.key('good')}", "X-Request-Id": sent},
        timeout=30,
    )
    assert resp.status_code == 200
    got = resp.headers["x-request-id"]
    if echoed:
        assert got == sent
    else:
        assert got != sent
        assert len(got) == 32


def test_request_id_is_generated_on_errors_too(fleet: Fleet) -> None:
    resp = httpx.post(f"{fleet.base_url}/v1/chat/completions", content=b"{", timeout=10)
    assert resp.status_code == 401
    assert len(resp.headers["x-request-id"]) == 32
    echoed = httpx.get(f"{fleet.base_url}/nowhere", headers={"X-Request-Id": "r-1"}, timeout=10)
    assert echoed.headers["x-request-id"] == "r-1"


def test_healthz_and_readyz(fleet: Fleet) -> None:
    assert httpx.get(f"{fleet.base_url}/healthz", timeout=10).json() == {"status": "ok"}
    ready = httpx.get(f"{fleet.base_url}/readyz", timeout=10)
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    assert ready.json()["snapshot_version"] >= 1


def test_metrics_has_the_stage_histograms(client: openai.OpenAI, fleet: Fleet) -> None:
    list(
        client.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, max_tokens=4, stream=True
        )
    )
    text = httpx.get(f"{fleet.base_url}/metrics", timeout=10).text
    assert "# TYPE switchyard_stage_seconds histogram" in text
    for stage in ("auth", "queue", "upstream_ttft", "inter_token", "e2e"):
        assert f'stage="{stage}"' in text, stage
    assert (
        'switchyard_requests_total{class="interactive",model="sim-chat",outcome="ok",tenant="acme"}'
        in text
    )
    assert "switchyard_inflight_requests" in text
