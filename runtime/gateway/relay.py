"""Relaying an upstream response to the client: SSE exactly as OpenAI frames it, or JSON.

Each upstream event goes out as ``data: <payload>\\n\\n`` the moment it arrives, bytes
untouched: a chunk read from the engine that is exactly the framing of the events it
completes (:meth:`~runtime.upstream.response.UpstreamResponse.batches`) goes out as the
engine's own bytes when every event in it goes out unchanged (no copy, no re-framing);
the relay reads each payload only for what it must know (the first chunk's id, usage,
a choice's finish, the token count). The exception: the usage-only final chunk is dropped
when the client did not ask for ``stream_options.include_usage`` (the router always asks
upstream, to meter); then the choices' final chunks carry the ``system_fingerprint`` that
chunk had, as vLLM puts it there for a client that did not ask. The stream ends with
``data: [DONE]\\n\\n``. If the upstream breaks after the first byte, a terminal chunk
with ``finish_reason: "error"`` and an ``error`` object goes out, then ``[DONE]``. If the
router cuts the stream itself (its SIGTERM grace period ended: the relay's task is cancelled
while ``cut()`` names a reason), the terminal chunk carries that reason's error
(``router_shutdown``), then ``[DONE]``: a client never sees a bare close.

Inter-token gaps go into the record (``gaps_ms``) per event and into the ``inter_token``
histogram by :data:`TOKEN_BATCH` at once (and at the end); the events of one chunk read
arrived together (gaps of 0).

While streaming, ``on_tokens(n)`` reports the generated chunks in batches of
:data:`TOKEN_BATCH` (one chunk is about one token; a chat stream's opening role-only chunk is
not counted; the caller corrects with the final usage), so fairness counters move as output
streams, without a call per token.

With an output ``screen`` (the ``postfilter`` stage's, :mod:`runtime.gateway.screen`), each
chunk's text is checked before it goes out; on a stop the upstream is closed at once (the
engine drops the sequence), the stream ends with the screen's ``content_filter`` frames and
``[DONE]``, and the result's usage is the prompt plus the tokens received up to the stop
(what settling bills). A unary answer is screened before it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import msgspec
from prometheus_client import Histogram

from runtime.gateway.errors import ApiError
from runtime.gateway.screen import OutputScreen
from runtime.telemetry.histograms import observe_many
from runtime.telemetry.metrics import RouterMetrics, StageLabels
from runtime.upstream.errors import StreamBroken
from runtime.upstream.response import EventSource, UpstreamResponse, batches_of

SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)
DONE_FRAME = b"data: [DONE]\n\n"
TOKEN_BATCH = 8


class ResponseSink(Protocol):
    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None: ...

    def send_chunk(self, data: bytes, *, last: bool = False) -> Awaitable[None]: ...


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class _UsageProbe(msgspec.Struct):
    usage: Usage | None = None
    choices: list[msgspec.Raw] | None = None
    system_fingerprint: str | None = None


class _Meta(msgspec.Struct):
    id: str = ""
    created: int = 0
    model: str = ""


class RelayResult(msgspec.Struct, kw_only=True):
    outcome: str = "ok"  # "ok" | "stream_broken" | "deadline_exceeded" | "content_filter"
    usage: Usage | None = None
    events: int = 0
    gaps_ms: list[float] = []  # inter-token latency: gaps between streamed events


_usage_decoder = msgspec.json.Decoder(_UsageProbe)
_meta_decoder = msgspec.json.Decoder(_Meta)


def _usage_of(payload: bytes) -> _UsageProbe | None:
    if b'"usage"' not in payload:
        return None
    try:
        return _usage_decoder.decode(payload)
    except msgspec.DecodeError:  # includes ValidationError: not ours to judge, relay it
        return None


def _meta_of(payload: bytes) -> _Meta:
    try:
        return _meta_decoder.decode(payload)
    except msgspec.DecodeError:
        return _Meta()


def _is_final(payload: bytes) -> bool:
    """A choice's last chunk (``finish_reason`` set), as vLLM writes JSON (no spaces)."""
    at = payload.find(b'"finish_reason":')  # one scan for the common, unfinished chunk
    return (
        at >= 0
        and not payload.startswith(b"null", at + 16)
        and b'"finish_reason":null' not in payload[at + 16 :]
    )


def _stamped(payload: bytes, fingerprint: str | None) -> bytes:
    """``payload`` with ``system_fingerprint`` added, as vLLM stamps a stream's final chunks
    when the client did not ask for usage (it moves it to the usage chunk otherwise)."""
    if fingerprint is None or b'"system_fingerprint"' in payload or not payload.endswith(b"}"):
        return payload
    return payload[:-1] + b',"system_fingerprint":' + msgspec.json.encode(fingerprint) + b"}"


def _frames(payloads: list[bytes], fingerprint: str | None = None) -> bytes:
    return b"".join(b"data: " + _stamped(p, fingerprint) + b"\n\n" for p in payloads)


def broken_error(error: StreamBroken) -> ApiError:
    """The table's error for an upstream that broke mid-stream."""
    if error.reason == "deadline":
        return ApiError.of("deadline_exceeded", when="mid-stream")
    return ApiError.of("stream_broken")


def terminal_error_chunk(kind: str, meta: _Meta, failure: ApiError) -> bytes:
    """The last chunk of a stream that ended in ``failure`` after its first byte (the
    table's ``deadline_exceeded``, ``stream_broken`` or ``router_shutdown``)."""
    choice: dict[str, object] = {"index": 0, "finish_reason": "error"}
    if kind == "chat":
        choice["delta"] = {}
    else:
        choice["text"] = ""
    document = {
        "id": meta.id,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": meta.created or int(time.time()),
        "model": meta.model,
        "choices": [choice],
        "error": failure.document(),
    }
    return msgspec.json.encode(document)


class _TokenBatches:
    """Reports generated chunks to ``on_tokens`` in batches of :data:`TOKEN_BATCH`."""

    def __init__(self, on_tokens: Callable[[int], None] | None) -> None:
        self.on_tokens = on_tokens
        self.unreported = 0
        self.total = 0  # every chunk counted (the output tokens of a stream stopped early)

    def count(self) -> None:
        self.total += 1
        if self.on_tokens is None:
            return
        self.unreported += 1
        if self.unreported >= TOKEN_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.on_tokens is not None and self.unreported:
            self.on_tokens(self.unreported)
        self.unreported = 0


async def relay_stream(
    sink: ResponseSink,
    upstream: EventSource,
    *,
    kind: str,
    include_usage: bool,
    headers: Iterable[tuple[bytes, bytes]],
    metrics: RouterMetrics,
    labels: StageLabels,
    on_tokens: Callable[[int], None] | None = None,
    cut: Callable[[], str | None] | None = None,
    result: RelayResult | None = None,
    screen: OutputScreen | None = None,
) -> RelayResult:
    """Relay an SSE stream; the first event is already buffered in ``upstream``.

    ``cut()``, asked when the relay is cancelled, names the error code the router cuts the
    stream with (None: the client went away, nothing more is sent). ``result``, when given,
    is filled as the stream goes (its outcome and usage are final when the last chunk is
    sent) and returned."""
    result = RelayResult() if result is None else result
    relay = _StreamRelay(kind, include_usage, metrics.stage_observer("inter_token", labels),
                         result, tokens=_TokenBatches(on_tokens), screen=screen)  # fmt: skip
    await sink.start_response(200, [*SSE_HEADERS, *headers])
    try:
        # batches() is an async generator; closing it at once releases the upstream socket.
        async with contextlib.aclosing(batches_of(upstream)) as batches:
            async for raw, payloads in batches:
                out, end = relay.batch(raw, payloads)
                if end is not None:  # stop the engine first, then tell the client
                    await batches.aclose()
                    if out:
                        await sink.send_chunk(out)
                    await _stop_with(sink, end, result, screen, relay.tokens)
                    return result
                if out:
                    await sink.send_chunk(out)
    except StreamBroken as exc:
        result.outcome = "deadline_exceeded" if exc.reason == "deadline" else "stream_broken"
        relay.tokens.flush()  # counted before the end: what settles at the last chunk bills them
        await _end_with(sink, kind, relay.meta, broken_error(exc), relay.held)
        return result
    except asyncio.CancelledError:
        reason = cut() if cut is not None else None
        if reason is not None:  # the router cuts it (held chunks are not final any more)
            result.outcome = reason
            relay.tokens.flush()
            await _end_with(sink, kind, relay.meta, ApiError.of(reason), [])
        raise
    finally:
        relay.tokens.flush()
        relay.observe_gaps()
    await _end_stream(sink, relay.held, result, screen, relay.tokens)
    return result


class _StreamRelay:
    """What the relay does to each payload; a batch whose payloads all go out unchanged
    goes out as the engine's own bytes (no re-framing)."""

    __slots__ = ("held", "include_usage", "inter_token", "kind", "last", "meta", "observed",
                 "result", "screen", "tokens")  # fmt: skip

    def __init__(
        self, kind: str, include_usage: bool, inter_token: Histogram, result: RelayResult, *,
        tokens: _TokenBatches, screen: OutputScreen | None,
    ) -> None:  # fmt: skip
        self.kind = kind
        self.include_usage = include_usage
        self.inter_token = inter_token
        self.observed = 0  # gaps observed into inter_token so far (in batches)
        self.result = result
        self.tokens = tokens
        self.screen = screen
        self.meta: _Meta | None = None
        # The router asks upstream for usage even when the client did not; then each
        # choice's final chunk waits for the usage chunk (dropped), which tells what vLLM
        # would have put on it: the system fingerprint. The client sees what the engine
        # alone would send.
        self.held: list[bytes] = []
        self.last = time.perf_counter()  # not loop.time(): uvloop's clock ticks in ms

    def batch(self, raw: bytes | None, payloads: list[bytes]) -> tuple[bytes, bytes | None]:
        """The bytes to send for a batch, and the frames that end the stream if the screen
        stops it (the bytes are then those of the payloads before the stop)."""
        result = self.result
        now = time.perf_counter()  # the batch's events arrived together
        gaps = result.gaps_ms  # inter-token latency: the gaps between events
        if result.events:
            gaps.append((now - self.last) * 1000.0)
        self.last = now
        if len(payloads) == 1:  # the common case: one event per read
            result.events += 1
            payload = payloads[0]
            step = self._step(payload)
            if len(gaps) - self.observed >= TOKEN_BATCH:
                self.observe_gaps()
            if step is None:
                return (raw if raw is not None else b"data: " + payload + b"\n\n"), None
            return (b"", step.end) if isinstance(step, _Stop) else (step, None)
        gaps.extend([0.0] * (len(payloads) - 1))
        if len(gaps) - self.observed >= TOKEN_BATCH:
            self.observe_gaps()
        frames: list[bytes] | None = None  # built only once a payload is not relayed as is
        for index, payload in enumerate(payloads):
            result.events += 1
            step = self._step(payload)
            if step is None:
                if frames is not None:
                    frames.append(b"data: " + payload + b"\n\n")
                continue
            if frames is None:
                frames = [b"data: " + p + b"\n\n" for p in payloads[:index]]
            if isinstance(step, _Stop):
                return b"".join(frames), step.end
            frames.append(step)
        if frames is not None:
            return b"".join(frames), None
        return (raw if raw is not None else _frames(payloads)), None

    def _step(self, payload: bytes) -> bytes | _Stop | None:
        """None (``payload`` goes out as it came), the bytes that replace it (empty: none),
        or a stop."""
        if self.meta is None:
            self.meta = _meta_of(payload)
        # the scan inline: most chunks carry no usage (one call per chunk fewer, #27)
        probe = _usage_of(payload) if b'"usage"' in payload else None
        if probe is not None and probe.usage is not None:
            self.result.usage = probe.usage
            if not probe.choices and not self.include_usage:
                held, self.held = self.held, []
                return _frames(held, probe.system_fingerprint) if held else b""
        # A chat stream opens with a role-only chunk (no token); usage-only chunks carry
        # none either.
        opening = self.kind == "chat" and self.result.events == 1
        if not opening and (probe is None or bool(probe.choices)):
            tokens, screen = self.tokens, self.screen
            tokens.count()
            if screen is not None and (end := screen.chunk(payload, tokens.total)) is not None:
                return _Stop(end)
        if not self.include_usage and _is_final(payload):
            self.held.append(payload)
            return b""
        return None

    def observe_gaps(self) -> None:
        """The gaps not observed yet into the ``inter_token`` histogram, at once."""
        gaps = self.result.gaps_ms
        if len(gaps) > self.observed:
            observe_many(self.inter_token, gaps[self.observed :], scale=0.001)
            self.observed = len(gaps)


class _Stop:
    __slots__ = ("end",)

    def __init__(self, end: bytes) -> None:
        self.end = end


async def _end_stream(
    sink: ResponseSink, held: list[bytes], result: RelayResult, screen: OutputScreen | None,
    tokens: _TokenBatches,
) -> None:  # fmt: skip
    """The stream's last frames: the held final chunks and ``[DONE]``, unless the screen
    stops it at its very end (a match held back until then; its final chunks not sent)."""
    end = screen.finish(tokens.total) if screen is not None else None
    if end is not None:
        await _stop_with(sink, end, result, screen, tokens)
    else:
        await sink.send_chunk(_frames(held) + DONE_FRAME, last=True)


async def _stop_with(
    sink: ResponseSink, end: bytes, result: RelayResult, screen: OutputScreen | None,
    tokens: _TokenBatches,
) -> None:  # fmt: skip
    """End a stream the post-filter stopped; it is billed the prompt and the tokens received
    (the result's usage, settled as the last chunk goes out)."""
    tokens.flush()
    result.outcome = "content_filter"
    if screen is not None:
        result.usage = Usage(**screen.usage(tokens.total))
    await sink.send_chunk(end, last=True)


async def end_cut(
    sink: ResponseSink, *, kind: str, reason: str, chunk_id: str = "", created: int = 0,
    model: str = "",
) -> None:  # fmt: skip
    """End a stream the router cuts itself (``reason``: the table's code, e.g.
    ``router_shutdown``) with its terminal chunk and ``[DONE]``; ``chunk_id``, ``created`` and
    ``model`` are the stream's own, for the terminal chunk."""
    meta = _Meta(id=chunk_id, created=created, model=model)
    await _end_with(sink, kind, meta, ApiError.of(reason), [])


async def end_with_error(sink: ResponseSink, *, kind: str, failure: ApiError, model: str) -> None:
    """End a stream whose headers went out before its first token (a queued stream's
    heartbeats) with ``failure``'s terminal chunk and ``[DONE]``."""
    await _end_with(sink, kind, _Meta(model=model), failure, [])


async def _end_with(
    sink: ResponseSink, kind: str, meta: _Meta | None, failure: ApiError, held: list[bytes]
) -> None:
    """End a stream with the terminal chunk of ``failure`` and ``[DONE]``."""
    frame = terminal_error_chunk(kind, meta or _Meta(), failure)
    await sink.send_chunk(_frames(held) + b"data: " + frame + b"\n\n" + DONE_FRAME, last=True)


async def relay_unary(
    sink: ResponseSink, upstream: UpstreamResponse, *, headers: Iterable[tuple[bytes, bytes]],
    result: RelayResult | None = None, screen: OutputScreen | None = None,
) -> RelayResult:  # fmt: skip
    """Relay a whole JSON body as it came, or as the ``screen`` cut it (``result``, when
    given, is filled before the body is sent, and returned)."""
    body = await upstream.read_json()
    probe = _usage_of(body)
    screened = screen.unary(body) if screen is not None else None
    result = RelayResult() if result is None else result
    result.usage = probe.usage if probe is not None else None
    result.events = 1
    if screened is not None:
        body, result.outcome = screened, "content_filter"
    length = (b"content-length", str(len(body)).encode("ascii"))
    await sink.start_response(200, [(b"content-type", b"application/json"), length, *headers])
    await sink.send_chunk(body, last=True)
    return result
