"""Steady client traffic for the chaos suite: a few threads streaming short chat completions
through the router, each request with its own deadline, every ending classified.

Each client loops: one streaming request (8 tokens; client 0 asks for 400, so that a kill
lands mid-stream too) (``X-Request-Timeout`` = :data:`DEADLINE_S`, the HTTP
client's own timeout a little longer, so a hang is seen as one), then a short pause. Each
request becomes a :class:`Result` whose ``outcome`` is one of:

- ``ok``: HTTP 200, chunks, a last chunk with a normal ``finish_reason``, then ``[DONE]``;
- ``terminal:<code>``: HTTP 200 ending with our terminal chunk (``finish_reason: "error"`` and
  an ``error`` object whose code is in the gateway's table) then ``[DONE]``;
- ``refused:<code>``: a non-200 answer with our OpenAI error document (503, 429, 504...);
- ``unreachable``: the router did not accept the connection or closed it before any
  response byte (it is down);
- ``cut``: a stream that ended without ``[DONE]`` or a terminal chunk (a bare close);
- ``raw_error``: an error that is not ours (vLLM's error event or document, a non-JSON body);
- ``hang``: the client's timeout passed (the router never ended the request in time).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import httpx

from runtime.gateway.errors import ERROR_KINDS

DEADLINE_S = 20.0  # each request's deadline (X-Request-Timeout)
CLIENT_SLACK_S = 5.0  # the HTTP client gives up this much later: then it is a hang
PAUSE_S = 0.4  # between a client's requests (acme's demo limit is 600 per minute)
MAX_TOKENS = 8
LONG_MAX_TOKENS = 400  # client 0: a longer stream, so that kills land mid-stream too
MID_STREAM_EVENTS = 4  # long_streaming is set once client 0's stream has this many events


@dataclass(frozen=True)
class Result:
    started: float  # time.monotonic()
    ended: float
    outcome: str
    detail: str = ""

    @property
    def took_s(self) -> float:
        return self.ended - self.started


def sse_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of an SSE body, split only where SSE splits them (LF, CRLF). httpx's
    ``iter_lines`` splits like ``str.splitlines``, also at U+0085, U+2028 and U+2029, which
    JSON leaves unescaped inside strings: the tiny random model does emit them, and an event
    cut there would read as a malformed (not ours) chunk."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            yield raw.removesuffix(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.removesuffix(b"\r").decode("utf-8", "replace")


def _ours(error: object) -> bool:
    return isinstance(error, dict) and error.get("code") in ERROR_KINDS


def classify_stream(lines: list[str]) -> tuple[str, str]:
    """The outcome of a 200 SSE answer from its ``data:`` payloads."""
    if not lines:
        return "cut", "no event"
    chunks = []
    for line in lines:
        if line == "[DONE]":
            continue
        try:
            chunks.append(json.loads(line))
        except ValueError:
            return "raw_error", line[:200]
    for chunk in chunks:
        if "error" in chunk and not _ours(chunk["error"]):
            return "raw_error", json.dumps(chunk)[:300]
    if lines[-1] != "[DONE]":
        return "cut", f"{len(lines)} events, last {lines[-1][:200]}"
    last = chunks[-1] if chunks else {}
    if "error" in last:
        finish = [c.get("finish_reason") for c in last.get("choices", [])]
        if finish != ["error"]:
            return "raw_error", json.dumps(last)[:300]
        return f"terminal:{last['error']['code']}", ""
    finishes = [c.get("finish_reason") for chunk in chunks for c in chunk.get("choices", [])]
    if not any(finishes):
        return "cut", "[DONE] without a finished choice"
    return "ok", ""


def classify_refusal(status: int, body: bytes) -> tuple[str, str]:
    try:
        document = json.loads(body)
    except ValueError:
        return "raw_error", f"HTTP {status}: {body[:200]!r}"
    error = document.get("error") if isinstance(document, dict) else None
    if not _ours(error):
        return "raw_error", f"HTTP {status}: {body[:300]!r}"
    assert isinstance(error, dict)
    return f"refused:{error['code']}", f"HTTP {status}"


@dataclass
class Traffic:
    """``clients`` threads sending requests to ``router`` until :meth:`stop`."""

    router: str  # http://127.0.0.1:PORT
    api_key: str
    model: str = "demo-llama"
    clients: int = 3
    results: list[Result] = field(default_factory=list)
    long_streaming: threading.Event = field(default_factory=threading.Event)  # client 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Traffic:
        for n in range(self.clients):
            thread = threading.Thread(target=self._loop, args=(n,), name=f"chaos-client-{n}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> list[Result]:
        """Stop the clients (each finishes its request: bounded by the client timeout)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=DEADLINE_S + CLIENT_SLACK_S + 5)
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"clients still running: {alive}"
        with self._lock:
            return list(self.results)

    def snapshot(self) -> list[Result]:
        with self._lock:
            return list(self.results)

    def _loop(self, n: int) -> None:
        timeout = httpx.Timeout(DEADLINE_S + CLIENT_SLACK_S, connect=2.0)
        with httpx.Client(timeout=timeout) as client:
            while not self._stop.is_set():
                result = self.one(client, n)
                with self._lock:
                    self.results.append(result)
                self._stop.wait(PAUSE_S)

    def one(self, client: httpx.Client, n: int) -> Result:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"Say something, client {n}."}],
            "max_tokens": LONG_MAX_TOKENS if n == 0 else MAX_TOKENS,
            "ignore_eos": n == 0,  # vLLM's: the demo model's random weights may end early
            "stream": True,
        }
        headers = {
            "Authorization": f"Bearer {self.api_key}",
            "X-Request-Timeout": f"{DEADLINE_S:g}",
            "Cache-Control": "no-store",  # every request reaches the engine
        }
        started = time.monotonic()
        lines: list[str] = []
        answered = False
        try:
            with client.stream(
                "POST", f"{self.router}/v1/chat/completions", json=body, headers=headers
            ) as resp:
                answered = True
                if resp.status_code != 200:
                    outcome, detail = classify_refusal(resp.status_code, resp.read())
                    return Result(started, time.monotonic(), outcome, detail)
                for line in sse_lines(resp.iter_bytes()):
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        if n == 0 and len(lines) == MID_STREAM_EVENTS:
                            self.long_streaming.set()
        except httpx.ConnectError as exc:
            return Result(started, time.monotonic(), "unreachable", str(exc))
        except httpx.TimeoutException as exc:
            return Result(started, time.monotonic(), "hang", repr(exc))
        except httpx.HTTPError as exc:  # the connection closed mid-answer
            if not answered:  # before any response byte (a kept-alive connection to a dead
                return Result(started, time.monotonic(), "unreachable", repr(exc))  # router)
            outcome, detail = classify_stream(lines)
            if outcome == "ok":  # complete, then an unclean close: not a cut stream
                return Result(started, time.monotonic(), outcome, detail)
            return Result(started, time.monotonic(), "cut", f"{exc!r} after {len(lines)}")
        finally:
            if n == 0:
                self.long_streaming.clear()
        outcome, detail = classify_stream(lines)
        return Result(started, time.monotonic(), outcome, detail or f"{len(lines)} events")
