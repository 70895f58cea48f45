"""CPU per request of the safety stages as the router runs them (20-rule pack).

``python -m bench.safety_stages [--iterations 5000] [--tokens 200]`` runs the real stage
objects (:class:`~runtime.gateway.pipeline.stages.prefilter.Prefilter`,
:class:`~runtime.gateway.pipeline.stages.postfilter.Postfilter`) on a request context as the
pipeline builds it (snapshot, principal, plan, decoded body), and the relay's per-chunk check
(:meth:`runtime.gateway.screen.OutputScreen.chunk` on real SSE payloads, their JSON decode
included), timed with ``time.process_time``:

- ``prefilter`` / ``postfilter`` with no pack attached (the early return every request pays);
- ``prefilter`` on a clean request and on one it redacts (the upstream body re-encoded),
  ``postfilter`` setting up the screen, with the 20-rule pack of :mod:`bench.safety_micro`;
- the screen per streamed chunk, and over a whole ``tokens``-token answer.

Interventions go to a recorder that is never started (no Redis): ``record`` is what the
request path pays (a counter and a list append).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from bench.safety_micro import TURNS, chat_request, twenty_rule_pack
from bench.stage_context import chat_context, cpu_us_per_call
from runtime.gateway.bundles import SafetyDeps
from runtime.gateway.interventions import InterventionRecorder
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.postfilter import Postfilter
from runtime.gateway.pipeline.stages.prefilter import Prefilter
from runtime.gateway.safety_classifier import UpstreamClassifier
from runtime.safety.compiled import PackCache
from runtime.snapshot import SafetySnap, Snapshot
from runtime.testing.snapshots import SnapshotBuilder
from runtime.upstream.client import UpstreamClient

MODEL = "tiny"


def _snapshot(safety: SafetySnap) -> Snapshot:
    world = SnapshotBuilder()
    world.add_tenant("acme")
    world.add_key("k", "acme")
    world.add_model(MODEL, 1)
    return msgspec.structs.replace(world.snapshot(), safety=safety)


def _context(snapshot: Snapshot, body: bytes, packs: tuple[Any, ...] = ()) -> RequestContext:
    ctx = chat_context(snapshot, body, model=MODEL, prompt_tokens=400)
    ctx.packs = packs  # what the prefilter found (the postfilter reads it)
    return ctx


def _stage_us(
    stage: Any, snapshot: Snapshot, body: bytes, iterations: int, packs: tuple[Any, ...] = ()
) -> float:
    """CPU microseconds per call of ``stage`` (a fresh context each time, built untimed)."""
    contexts = [_context(snapshot, body, packs) for _ in range(iterations)]
    return cpu_us_per_call(stage, contexts, warm=_context(snapshot, body, packs))


def measure(iterations: int, tokens: int) -> dict[str, float]:
    recorder = InterventionRecorder("redis://127.0.0.1:1/0", namespace="bench", registry=None)
    deps = SafetyDeps(packs=PackCache(), events=recorder,
                      classifier=UpstreamClassifier(UpstreamClient(), lambda: None))  # fmt: skip
    pre, post = Prefilter(deps), Postfilter(deps)
    bare = _snapshot(SafetySnap())
    packed = _snapshot(SafetySnap(packs={"twenty": twenty_rule_pack()},
                                  tenants={"acme": ("twenty",)}))  # fmt: skip
    clean = msgspec.json.encode(chat_request())
    dirty = msgspec.json.encode(chat_request(" Mail me at jo.doe@example.com, please."))

    async def screened() -> Any:
        ctx = _context(packed, clean)
        await pre(ctx)
        await post(ctx)
        return ctx.screen

    loop = asyncio.new_event_loop()
    screen = loop.run_until_complete(screened())
    loop.close()
    assert screen is not None
    answer = " ".join(TURNS * 4)
    payloads = [msgspec.json.encode({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                                     "model": MODEL, "choices": [{"index": 0, "delta":
                                     {"content": answer[i : i + 4]}, "finish_reason": None}]})
                for i in range(0, 4 * tokens, 4)]  # fmt: skip
    start = time.process_time()
    rounds = max(1, iterations // tokens * 4)
    for _ in range(rounds):
        screen._filters.clear()  # a fresh stream each round
        for n, payload in enumerate(payloads, 1):
            if screen.chunk(payload, n) is not None:
                raise AssertionError("a clean answer stopped")
    per_stream = (time.process_time() - start) / rounds * 1e6
    return {
        "prefilter_none_us": _stage_us(pre, bare, clean, iterations),
        "postfilter_none_us": _stage_us(post, bare, clean, iterations),
        "prefilter_clean_us": _stage_us(pre, packed, clean, iterations),
        "prefilter_redact_us": _stage_us(pre, packed, dirty, iterations),
        "postfilter_setup_us": _stage_us(
            post, packed, clean, iterations, deps.packs.packs_for(packed.safety, "acme", MODEL)
        ),
        "screen_chunk_us": per_stream / len(payloads),
        "screen_stream_us": per_stream,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=5_000)
    parser.add_argument("--tokens", type=int, default=200, help="output tokens per answer")
    args = parser.parse_args(argv)
    m = measure(args.iterations, args.tokens)
    print("safety stages, 20-rule pack, 1,011 characters of chat text (CPU per call)")
    print(f"prefilter, no pack attached:    {m['prefilter_none_us']:8.2f} us")
    print(f"postfilter, no pack attached:   {m['postfilter_none_us']:8.2f} us")
    print(f"prefilter, clean (pass):        {m['prefilter_clean_us']:8.1f} us")
    print(f"prefilter, redacts an e-mail:   {m['prefilter_redact_us']:8.1f} us")
    print(f"postfilter, sets up the screen: {m['postfilter_setup_us']:8.2f} us")
    print(f"relay screen, per chunk:        {m['screen_chunk_us']:8.2f} us (JSON decode included)")
    print(f"relay screen, {args.tokens}-token answer: {m['screen_stream_us']:8.1f} us")


if __name__ == "__main__":
    main()
