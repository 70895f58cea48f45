"""Resume by continuation, the pure part (runtime/gateway/resume.py) and the migrating stream's
decisions (runtime/gateway/migrate.py) over scripted upstream streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from runtime.gateway.migrate import MigratingStream
from runtime.gateway.resume import (
    NotResumable,
    Progress,
    Seam,
    check_resumable,
    continuation,
    length_end,
    progress_of,
)
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.upstream.errors import NoEndpointAvailable, StreamBroken, UpstreamHTTPError
from runtime.upstream.response import UpstreamResponse

pytestmark = pytest.mark.unit


def chat_chunk(content: str | None = None, *, role: bool = False, finish: str | None = None,
               chunk_id: str = "chatcmpl-1", created: int = 100) -> bytes:  # fmt: skip
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    return json.dumps({
        "id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }, separators=(",", ":")).encode()  # fmt: skip


def text_chunk(text: str, *, finish: str | None = None, chunk_id: str = "cmpl-1") -> bytes:
    return json.dumps({
        "id": chunk_id, "object": "text_completion", "created": 100, "model": "m",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }, separators=(",", ":")).encode()  # fmt: skip


def usage_chunk(prompt: int, completion: int, *, chunk_id: str) -> bytes:
    return json.dumps({"id": chunk_id, "object": "chat.completion.chunk", "created": 200,
                       "model": "m", "choices": [],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}}).encode()  # fmt: skip


def test_progress_decodes_text_and_counts_tokens_without_the_role_chunk() -> None:
    payloads = [chat_chunk("", role=True), chat_chunk("Hel"), chat_chunk("lo"), chat_chunk(" you")]
    progress = progress_of("chat", payloads)
    assert (progress.text, progress.tokens) == ("Hello you", 3)
    assert (progress.chunk_id, progress.created, progress.model) == ("chatcmpl-1", 100, "m")
    completion = progress_of("completion", [text_chunk("a"), text_chunk(""), text_chunk("b")])
    assert (completion.text, completion.tokens) == ("ab", 3)  # an empty-text step is a token


@pytest.mark.parametrize(
    ("kind", "payloads", "why"),
    [
        ("chat", [chat_chunk("x", finish="stop")], "finished"),
        ("chat", [b'{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"t"}]}}]}'], "not_text"),
        ("completion", [b"not json"], "undecodable"),
        ("completion", [b'{"choices":[{"index":1,"text":"x"}]}'], "several_choices"),
    ],
)
def test_progress_refuses_what_cannot_be_continued(
    kind: str, payloads: list[bytes], why: str
) -> None:
    with pytest.raises(NotResumable, match=why):
        progress_of(kind, payloads)


@pytest.mark.parametrize(
    ("kind", "document", "why"),
    [
        ("chat", {"messages": [], "n": 2}, "several_choices"),
        ("chat", {"messages": [], "logprobs": True}, "logprobs"),
        ("chat", {"messages": [], "response_format": {"type": "json_object"}}, "structured"),
        ("completion", {"prompt": "a", "echo": True}, "logprobs"),
        ("completion", {"prompt": ["a", "b"]}, "prompt_shape"),
        ("completion", {"prompt": [1, 2, 3]}, "prompt_shape"),
        ("embedding", {"input": "a"}, "kind"),
    ],
)
def test_requests_that_cannot_resume_are_named(
    kind: str, document: dict[str, Any], why: str
) -> None:
    with pytest.raises(NotResumable, match=why):
        check_resumable(kind, document)


def test_chat_continuation_appends_the_text_as_the_final_assistant_message() -> None:
    document = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
                "min_tokens": 4, "stream": True, "temperature": 0, "x_unknown": 1}  # fmt: skip
    body = continuation("chat", document, Progress(text="Hello", tokens=3))
    assert body is not None
    assert body["messages"] == [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "Hello"}]  # fmt: skip
    assert body["continue_final_message"] is True
    assert body["add_generation_prompt"] is False
    assert (body["max_tokens"], body["min_tokens"]) == (7, 1)
    assert body["x_unknown"] == 1
    assert body["temperature"] == 0
    assert document["messages"] == [{"role": "user", "content": "hi"}]  # not changed in place
    own = {**document, "messages": [{"role": "assistant", "content": "Once"}],
           "continue_final_message": True}  # fmt: skip
    again = continuation("chat", own, Progress(text=" upon", tokens=1))
    assert again is not None
    assert again["messages"] == [{"role": "assistant", "content": "Once upon"}]


def test_completion_continuation_extends_the_prompt_and_a_spent_budget_ends() -> None:
    body = continuation(
        "completion", {"prompt": "Once", "max_tokens": 5}, Progress(text=" a", tokens=2)
    )
    assert body is not None
    assert (body["prompt"], body["max_tokens"]) == ("Once a", 3)
    listed = continuation("completion", {"prompt": ["Once"], "max_completion_tokens": 5},
                          Progress(text=" a", tokens=2))  # fmt: skip
    assert listed is not None
    assert listed["prompt"] == ["Once a"]
    assert listed["max_tokens"] == 3
    assert "max_completion_tokens" not in listed
    assert continuation("completion", {"prompt": "x", "max_tokens": 2}, Progress(tokens=2)) is None


def test_seam_keeps_the_stream_id_drops_the_second_role_chunk_and_bills_tokens_once() -> None:
    seam = Seam("chat", Progress(text="Hello", tokens=3, chunk_id="chatcmpl-1", created=100))
    assert seam.rewrite(chat_chunk("", role=True, chunk_id="chatcmpl-2", created=200)) is None
    token = json.loads(seam.rewrite(chat_chunk(" there", chunk_id="chatcmpl-2")) or b"")
    assert (token["id"], token["created"], token["choices"][0]["delta"]) == (
        "chatcmpl-1", 100, {"content": " there"})  # fmt: skip
    usage = json.loads(seam.rewrite(usage_chunk(15, 4, chunk_id="chatcmpl-2")) or b"")
    # the continuation's prompt holds the 3 tokens generated before: billed as output only
    assert usage["usage"] == {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}


def test_length_end_is_a_final_length_chunk_and_the_usage() -> None:
    final, usage = length_end("completion", Progress(tokens=4, chunk_id="cmpl-1"), prompt_tokens=9)
    assert json.loads(final)["choices"] == [{"index": 0, "finish_reason": "length", "text": ""}]
    assert json.loads(usage)["usage"] == {"prompt_tokens": 9, "completion_tokens": 4,
                                          "total_tokens": 13}  # fmt: skip


# --- the migrating stream's decisions -------------------------------------------------------


class Scripted:
    """An upstream stream that yields ``payloads`` then breaks (``reason``) or ends."""

    def __init__(self, endpoint_id: int, payloads: list[bytes], reason: str | None) -> None:
        self.endpoint_id = endpoint_id
        self.payloads = payloads
        self.reason = reason
        self.closed = False

    async def events(self) -> AsyncGenerator[bytes, None]:
        for payload in self.payloads:
            yield payload
        if self.reason is not None:
            raise StreamBroken("cut", reason=self.reason, endpoint_id=self.endpoint_id)

    async def aclose(self) -> None:
        self.closed = True


class Opener:
    def __init__(self, *answers: Scripted | Exception) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []
        self.excluded: list[frozenset[int]] = []

    async def __call__(self, body: bytes, broken: frozenset[int]) -> UpstreamResponse:
        self.bodies.append(json.loads(body))
        self.excluded.append(broken)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]  # duck-typed stand-in


def drain(stream: MigratingStream) -> list[bytes]:
    async def run() -> list[bytes]:
        return [payload async for payload in stream.events()]

    return asyncio.run(run())


def migrating(
    first: Scripted, opener: Opener, *, limit: int = 2, body: dict[str, Any] | None = None
) -> tuple[MigratingStream, ResumeMetrics]:
    metrics = ResumeMetrics(CollectorRegistry())
    document = body or {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    stream = MigratingStream(
        first, kind="chat", body=json.dumps(document).encode(),  # type: ignore[arg-type]
        open_next=opener, limit=limit, metrics=metrics, prompt_tokens=5,
    )  # fmt: skip
    return stream, metrics


def outcomes(metrics: ResumeMetrics) -> dict[str, float]:
    found: dict[str, float] = {}
    for metric in metrics.resumes_total.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                outcome = sample.labels["outcome"]
                found[outcome] = found.get(outcome, 0.0) + sample.value
    return found


def test_a_broken_stream_moves_once_per_break_excluding_every_broken_endpoint() -> None:
    first = Scripted(1, [chat_chunk("", role=True), chat_chunk("A")], "disconnected")
    second = Scripted(2, [chat_chunk("", role=True, chunk_id="c2"), chat_chunk("B", chunk_id="c2")],
                      "engine_error")  # fmt: skip
    third = Scripted(3, [chat_chunk("", role=True, chunk_id="c3"),
                         chat_chunk("C", chunk_id="c3", finish="length")], None)  # fmt: skip
    opener = Opener(second, third)
    stream, metrics = migrating(first, opener)
    out = [json.loads(p) for p in drain(stream)]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in out) == "AB" + "C"
    assert {c["id"] for c in out} == {"chatcmpl-1"}
    assert sum("role" in c["choices"][0]["delta"] for c in out) == 1
    assert opener.excluded == [frozenset({1}), frozenset({1, 2})]
    assert [b["messages"][-1]["content"] for b in opener.bodies] == ["A", "AB"]
    assert [b["max_tokens"] for b in opener.bodies] == [5, 4]
    assert outcomes(metrics) == {"resumed": 2.0}
    assert stream.migrations == 2
    assert first.closed
    assert second.closed


def test_the_limit_then_the_original_break_reaches_the_relay() -> None:
    first = Scripted(1, [chat_chunk("A")], "disconnected")
    second = Scripted(2, [chat_chunk("B")], "stalled")
    stream, metrics = migrating(first, Opener(second), limit=1)
    with pytest.raises(StreamBroken) as info:
        drain(stream)
    assert info.value.reason == "stalled"
    assert outcomes(metrics) == {"resumed": 1.0, "limit": 1.0}


def test_no_endpoint_for_the_continuation_is_the_original_break() -> None:
    stream, metrics = migrating(Scripted(1, [chat_chunk("A")], "truncated"),
                                Opener(NoEndpointAvailable("none")))  # fmt: skip
    with pytest.raises(StreamBroken, match="cut"):
        drain(stream)
    assert outcomes(metrics) == {"failed": 1.0}


def test_a_deadline_break_never_moves() -> None:
    opener = Opener()
    stream, metrics = migrating(Scripted(1, [chat_chunk("A")], "deadline"), opener)
    with pytest.raises(StreamBroken):
        drain(stream)
    assert opener.bodies == []
    assert outcomes(metrics) == {}


def test_a_spent_budget_or_an_overfull_context_ends_with_length() -> None:
    spent, metrics = migrating(Scripted(1, [chat_chunk("A"), chat_chunk("B")], "disconnected"),
                               Opener(), body={"messages": [], "max_tokens": 2})  # fmt: skip
    out = [json.loads(p) for p in drain(spent)]
    assert out[-2]["choices"][0]["finish_reason"] == "length"
    assert out[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    too_long = UpstreamHTTPError(400, b'{"message":"This model\'s maximum context length is 64"}')
    full, metrics = migrating(Scripted(1, [chat_chunk("A")], "disconnected"), Opener(too_long))
    assert json.loads(drain(full)[-2])["choices"][0]["finish_reason"] == "length"
    assert outcomes(metrics) == {"length": 1.0}


def test_a_request_that_cannot_resume_keeps_todays_terminal_error() -> None:
    stream, metrics = migrating(Scripted(1, [chat_chunk("A")], "disconnected"), Opener(),
                                body={"messages": [], "max_tokens": 9, "n": 2})  # fmt: skip
    with pytest.raises(StreamBroken):
        drain(stream)
    assert outcomes(metrics) == {"not_resumable": 1.0}


def test_the_model_token_count_corrects_merged_chunks() -> None:
    """A loaded engine merges deltas: two chunks carried three tokens; the tokenizer's count
    of the text so far shrinks the budget and bills them once."""
    first = Scripted(1, [chat_chunk("", role=True), chat_chunk("AB"), chat_chunk("C")], "truncated")
    then = Scripted(2, [chat_chunk("D", chunk_id="c2"), usage_chunk(9, 3, chunk_id="c2")], None)
    opener = Opener(then)
    metrics = ResumeMetrics(CollectorRegistry())

    async def count(text: str) -> int | None:
        return len(text)  # one token per letter here

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    stream = MigratingStream(
        first, kind="chat", body=json.dumps(body).encode(),  # type: ignore[arg-type]
        open_next=opener, limit=2, metrics=metrics, count_tokens=count,
    )  # fmt: skip
    out = [json.loads(p) for p in drain(stream)]
    assert opener.bodies[0]["max_tokens"] == 3
    assert out[-1]["usage"] == {"prompt_tokens": 6, "completion_tokens": 6, "total_tokens": 12}
