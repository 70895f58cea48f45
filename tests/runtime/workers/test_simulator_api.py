"""The simulator's OpenAI-compatible API, driven by the official ``openai`` client and raw HTTP."""

from __future__ import annotations

import base64
import math
import struct

import aiohttp
import openai
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.server import create_app
from runtime.workers.simulator.text import count_chat_tokens, count_text_tokens
from runtime.workers.simulator.timing import Capacity, TimingModel

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MODEL = "sim-llama"
MAX_MODEL_LEN = 256


@pytest_asyncio.fixture
async def base_url():
    config = SimulatorConfig(
        model=MODEL,
        timing=TimingModel(prefill_tps=1e6, decode_a_ms=1, decode_b_ms=0),
        capacity=Capacity(max_num_seqs=8, kv_capacity_tokens=4096),
        max_model_len=MAX_MODEL_LEN,
        embedding_dim=32,
    )
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


@pytest_asyncio.fixture
async def client(base_url):
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest_asyncio.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def test_models_lists_the_served_model(client):
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "vllm"


async def test_health(base_url, http):
    async with http.get(f"{base_url}/health") as resp:
        assert resp.status == 200


async def test_chat_completion_unary(client):
    messages = [{"role": "user", "content": "Say something nice"}]
    result = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=7)
    assert result.id.startswith("chatcmpl-")
    assert result.object == "chat.completion"
    assert result.model == MODEL
    choice = result.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert len(choice.message.content.split()) == 7
    assert result.usage.completion_tokens == 7
    assert result.usage.prompt_tokens == count_chat_tokens(["Say something nice"])
    assert result.usage.total_tokens == result.usage.prompt_tokens + 7


async def test_chat_stream_with_usage_matches_the_unary_text(client):
    messages = [{"role": "user", "content": "Tell me a story"}]
    unary = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == unary.choices[0].message.content  # deterministic for the same request
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == unary.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


async def test_completion_unary_and_stream(client):
    result = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert result.id.startswith("cmpl-")
    assert result.object == "text_completion"
    assert result.choices[0].finish_reason == "length"
    assert result.usage.prompt_tokens == count_text_tokens("Once upon a time")
    assert result.usage.completion_tokens == 5
    stream = await client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    with_choices = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in with_choices) == result.choices[0].text
    assert [c.usage.completion_tokens for c in with_choices] == [1, 2, 3, 4, 5]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.total_tokens == result.usage.total_tokens


async def test_stream_ends_with_done_frame(base_url, http):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}
    async with http.post(f"{base_url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = (await resp.read()).decode()
    frames = raw.split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""]
    assert all(frame.startswith("data: {") for frame in frames[:-2])
    assert len(frames[:-2]) == 2


async def test_token_ids_prompt_and_request_id_header(base_url, http):
    body = {"model": MODEL, "prompt": [1, 2, 3, 4, 5], "max_tokens": 1}
    headers = {"X-Request-Id": "abc123"}
    async with http.post(f"{base_url}/v1/completions", json=body, headers=headers) as resp:
        result = await resp.json()
    assert result["id"] == "cmpl-abc123"
    assert result["usage"]["prompt_tokens"] == 5


async def test_without_max_tokens_the_output_stops_on_its_own(client):
    first = await client.completions.create(model=MODEL, prompt="Where does it end?")
    again = await client.completions.create(model=MODEL, prompt="Where does it end?")
    assert first.choices[0].text == again.choices[0].text
    assert first.choices[0].finish_reason in {"stop", "length"}
    assert 1 <= first.usage.completion_tokens <= MAX_MODEL_LEN - first.usage.prompt_tokens


async def test_ignore_eos_without_max_tokens_fills_the_context(client):
    result = await client.completions.create(
        model=MODEL, prompt="abcd" * 10, extra_body={"ignore_eos": True}
    )
    assert result.choices[0].finish_reason == "length"
    assert result.usage.total_tokens == MAX_MODEL_LEN


async def test_max_tokens_is_clamped_to_the_context_left(client):
    result = await client.completions.create(model=MODEL, prompt="abcd" * 200, max_tokens=200)
    assert result.usage.prompt_tokens == 200
    assert result.usage.completion_tokens == MAX_MODEL_LEN - 200
    assert result.choices[0].finish_reason == "length"


async def test_chat_content_parts_count_their_text_only(client):
    messages = [
        {"role": "system", "content": None},
        {"role": "user", "content": [
            {"type": "text", "text": "abcdefgh"},
            {"type": "image_url", "image_url": {"url": "http://example.invalid/x.png"}},
        ]},
    ]  # fmt: skip
    result = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert result.usage.prompt_tokens == count_chat_tokens(["", "abcdefgh"])


async def test_max_completion_tokens_wins_for_chat(client):
    result = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3
    )
    assert result.usage.completion_tokens == 3


async def test_embeddings_base64_by_default_and_float(client, base_url, http):
    result = await client.embeddings.create(model=MODEL, input=["one", "two words"])
    assert [d.index for d in result.data] == [0, 1]
    assert all(len(d.embedding) == 32 for d in result.data)
    assert math.fsum(v * v for v in result.data[0].embedding) == pytest.approx(1.0, rel=1e-5)
    assert result.usage.prompt_tokens == count_text_tokens("one") + count_text_tokens("two words")
    body = {"model": MODEL, "input": "one", "encoding_format": "float"}
    async with http.post(f"{base_url}/v1/embeddings", json=body) as resp:
        raw = await resp.json()
    assert raw["object"] == "list"
    assert raw["id"].startswith("embd-")
    assert raw["data"][0]["object"] == "embedding"
    assert raw["data"][0]["embedding"] == pytest.approx(result.data[0].embedding, rel=1e-6)
    body["encoding_format"] = "base64"
    async with http.post(f"{base_url}/v1/embeddings", json=body) as resp:
        packed = base64.b64decode((await resp.json())["data"][0]["embedding"])
    assert list(struct.unpack("<32f", packed)) == pytest.approx(raw["data"][0]["embedding"])


async def test_client_sees_vllm_errors(client):
    with pytest.raises(openai.NotFoundError) as not_found:
        await client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert not_found.value.status_code == 404
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client.completions.create(model=MODEL, prompt="abcd" * 300, max_tokens=1)


LONG = "abcd" * (MAX_MODEL_LEN + 1)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "message"),
    [
        ("completions", {"model": "other", "prompt": "x"}, 404, "model", "does not exist"),
        ("completions", {"prompt": LONG}, 400, "input_tokens", "maximum context length"),
        ("completions", {"prompt": "abcd" * MAX_MODEL_LEN}, 400, "input_tokens", "no room"),
        ("completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "at least 1"),
        ("completions", {"prompt": "x", "max_tokens": "3"}, 400, "max_tokens", "at least 1"),
        ("completions", {"prompt": "x", "max_tokens": MAX_MODEL_LEN + 1}, 400, "max_tokens",
         "cannot be greater than max_model_len"),
        ("completions", {"prompt": "x", "n": 2}, 400, "n", "n=1"),
        ("completions", {"prompt": ["a", "b"]}, 400, "prompt", "one prompt"),
        ("completions", {"prompt": 5}, 400, "prompt", "prompt must be"),
        ("completions", {}, 400, "prompt", "prompt must be"),
        ("completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
         "stream_options", "stream=True"),
        ("completions", {"prompt": "x", "stream": True, "stream_options": 3}, 400,
         "stream_options", "object"),
        ("completions", {"prompt": "x", "priority": "high"}, 400, "priority", "integer"),
        ("chat/completions", {"messages": []}, 400, "messages", "non-empty"),
        ("chat/completions", {"messages": [{"content": "x"}]}, 400, "messages", "role"),
        ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages",
         "content"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": -1}, 400, "max_completion_tokens",
         "at least 1"),
        ("embeddings", {"input": []}, 400, "input", "input must be"),
        ("embeddings", {"input": [1.5]}, 400, "input", "input must be"),
        ("embeddings", {"input": LONG}, 400, "input_tokens", "maximum context length"),
        ("embeddings", {"input": "x", "encoding_format": "hex"}, 400, "encoding_format",
         "encoding_format"),
        ("embeddings", {"input": "x", "dimensions": 8}, 400, "dimensions", "matryoshka"),
        ("embeddings", {"model": "other", "input": "x"}, 404, "model", "does not exist"),
        ("embeddings", {"input": "x", "priority": 1.5}, 400, "priority", "integer"),
    ],
)  # fmt: skip
async def test_errors_use_vllm_error_json(base_url, http, path, body, status, param, message):
    async with http.post(f"{base_url}/v1/{path}", json=body) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
    assert error["code"] == status
    assert error["param"] == param
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert message in error["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]"])
async def test_malformed_bodies_are_400(base_url, http, raw):
    headers = {"Content-Type": "application/json"}
    async with http.post(f"{base_url}/v1/chat/completions", data=raw, headers=headers) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["type"] == "BadRequestError"
