"""The post-filter on the relay (runtime/gateway/screen.py, relay.py): a stream stopped at the
chunk that decides a match, the upstream closed before the client hears the end, usage up to
the stop; unary answers and cached entries cut under the packs in force; the classifier's
model missing fails closed or open as the rule says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import msgspec
import pytest

from runtime.cache.entry import CachedUsage, Entry, sse_frames, unary_body
from runtime.gateway.relay import relay_stream, relay_unary
from runtime.gateway.safety_classifier import ClassifierUnavailableError, UpstreamClassifier
from runtime.gateway.screen import OutputScreen
from runtime.safety.classify import classify
from runtime.safety.compiled import CompiledPack, compile_pack
from runtime.safety.postfilter import Stop
from runtime.snapshot import PolicyPackSnap, SafetyRuleSnap, Snapshot
from runtime.telemetry.metrics import RouterMetrics, StageLabels
from runtime.upstream.client import UpstreamClient

pytestmark = pytest.mark.unit

PACK = compile_pack(PolicyPackSnap(name="house", version=3, rules=(
    SafetyRuleSnap(id="no-secret", kind="terms", action="stop", terms=("secret phrase",)),
)))  # fmt: skip


def chunk(text: str, *, index: int = 0, finish: str | None = None) -> bytes:
    return msgspec.json.encode({"id": "c-1", "object": "chat.completion.chunk", "created": 7,
                                "model": "m", "choices": [{"index": index,
                                "delta": {"content": text}, "finish_reason": finish}]})  # fmt: skip


def screen(stops: list[Stop], *, include_usage: bool = True, kind: str = "chat") -> OutputScreen:
    return OutputScreen([PACK], kind=kind, include_usage=include_usage, prompt_tokens=11,
                        on_stop=stops.append)  # fmt: skip


class Sink:
    def __init__(self) -> None:
        self.chunks: list[tuple[bytes, bool]] = []
        self.upstream_closed_when_last_sent: bool | None = None
        self.upstream: Upstream | None = None

    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        assert status == 200

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        if last and self.upstream is not None:
            self.upstream_closed_when_last_sent = self.upstream.closed
        self.chunks.append((data, last))

    def frames(self) -> list[Any]:
        body = b"".join(data for data, _ in self.chunks).decode()
        out: list[Any] = []
        for line in body.split("\n\n"):
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out


class Upstream:
    """An upstream stream's payloads; records whether the relay closed it."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.closed = False
        self.sent = 0

    async def events(self) -> AsyncGenerator[bytes, None]:
        try:
            for payload in self.payloads:
                self.sent += 1
                yield payload
                await asyncio.sleep(0)
        finally:
            self.closed = True


def test_a_phrase_across_chunks_ends_the_stream_with_content_filter_and_usage() -> None:
    stops: list[Stop] = []
    out = screen(stops)
    assert out.chunk(chunk(" the secret"), 1) is None
    end = out.chunk(chunk(" phrase!"), 2)  # the "!" decides the match (no word goes on)
    assert end is not None
    frames = [json.loads(f[6:]) if f != "data: [DONE]" else "[DONE]"
              for f in end.decode().strip().split("\n\n")]  # fmt: skip
    assert frames[0]["choices"][0]["finish_reason"] == "content_filter"
    assert frames[0]["id"] == "c-1"
    assert frames[1]["usage"] == {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
    assert frames[-1] == "[DONE]"
    assert [(s.pack, s.rule) for s in stops] == [("house", "no-secret")]
    assert out.chunk(chunk(" more"), 3) is not None  # a stopped stream stays stopped
    assert len(stops) == 1  # and is reported once


def test_relay_closes_the_upstream_before_the_last_chunk_and_bills_to_the_stop() -> None:
    stops: list[Stop] = []
    payloads = [chunk(""), chunk(" one"), chunk(" secret"), chunk(" phrase"), chunk(" three"),
                chunk(" four"), chunk(" five")]  # fmt: skip
    upstream, sink = Upstream(payloads), Sink()
    sink.upstream = upstream
    counted: list[int] = []
    result = asyncio.run(relay_stream(
        sink, upstream, kind="chat", include_usage=False, headers=(),  # type: ignore[arg-type]
        metrics=RouterMetrics(), labels=StageLabels(), on_tokens=counted.append,
        screen=screen(stops, include_usage=False),
    ))  # fmt: skip
    assert result.outcome == "content_filter"
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (11, 4)
    assert sum(counted) == 4  # the fairness counter saw every generated chunk
    assert upstream.sent == 5  # nothing read past the chunk that decided the stop
    assert sink.upstream_closed_when_last_sent is True  # the engine is told first
    frames = sink.frames()
    texts = [f["choices"][0]["delta"].get("content", "") for f in frames[:-1]]
    assert "".join(texts) == " one secret phrase"  # " three" decided it; it is withheld
    assert frames[-2]["choices"][0]["finish_reason"] == "content_filter"
    assert frames[-1] == "[DONE]"
    assert sink.chunks[-1][1] is True
    assert len(stops) == 1


def test_a_clean_stream_is_relayed_untouched() -> None:
    payloads = [chunk(" all"), chunk(" good", finish="stop")]
    upstream, sink = Upstream(payloads), Sink()
    result = asyncio.run(relay_stream(
        sink, upstream, kind="completion", include_usage=True, headers=(),  # type: ignore[arg-type]
        metrics=RouterMetrics(), labels=StageLabels(), screen=screen([]),
    ))  # fmt: skip
    assert result.outcome == "ok"
    assert b"".join(d for d, _ in sink.chunks) == b"".join(
        b"data: " + p + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"  # fmt: skip


class Whole:
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read_json(self) -> bytes:
        return self.body


def test_a_unary_answer_is_cut_before_it_is_sent() -> None:
    body = msgspec.json.encode({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok: the secret phrase here"},
         "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 6,
                                              "total_tokens": 9}})  # fmt: skip
    stops: list[Stop] = []
    sink = Sink()
    result = asyncio.run(relay_unary(sink, Whole(body), headers=(),  # type: ignore[arg-type]
                                     screen=screen(stops)))  # fmt: skip
    sent = json.loads(sink.chunks[0][0])
    assert sent["choices"][0]["message"]["content"] == "ok: the "
    assert sent["choices"][0]["finish_reason"] == "content_filter"
    assert sent["usage"]["completion_tokens"] == 6  # every generated token is billed
    assert result.outcome == "content_filter"
    assert len(stops) == 1


def test_a_cached_answer_is_screened_under_the_packs_in_force_when_replayed() -> None:
    entry = Entry(kind="chat", id="e", created=1, model="m",
                  chunks=(" a", " secret", " phrase", " b"), finish_reason="stop",
                  usage=CachedUsage(2, 4, 6), body=b'{"stored": true}')  # fmt: skip
    stops: list[Stop] = []
    cut = screen(stops).entry(entry)
    assert cut.chunks == (" a", " ")
    assert cut.finish_reason == "content_filter"
    assert json.loads(unary_body(cut))["choices"][0]["message"]["content"] == " a "
    assert b"content_filter" in b"".join(sse_frames(cut, include_usage=False))
    assert len(stops) == 1
    clean = msgspec.structs.replace(entry, chunks=(" fine",))
    assert screen([]).entry(clean) is clean


@pytest.mark.parametrize(("fail_open", "action", "failed"),
                         [(False, "refuse", "closed"), (True, "pass", "open")])  # fmt: skip
def test_a_classifier_without_a_ready_model_fails_closed_or_open(
    fail_open: bool, action: str, failed: str
) -> None:
    rule = SafetyRuleSnap(id="tox", kind="classifier", action="refuse", model="guard",
                          threshold=0.5, fail_open=fail_open)  # fmt: skip
    packs: list[CompiledPack] = [compile_pack(PolicyPackSnap(name="p", version=1, rules=(rule,)))]

    async def judged() -> Any:
        client = UpstreamClient()
        classifier = UpstreamClassifier(client, lambda: Snapshot(version=1, created_at=0.0))
        try:
            with pytest.raises(ClassifierUnavailableError):
                await classifier.score("guard", "hello")
            return await classify(packs, "hello", classifier)
        finally:
            await client.close()

    verdict = asyncio.run(judged())
    assert (verdict.action, verdict.failed, verdict.rule) == (action, failed, "tox")
