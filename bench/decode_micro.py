"""Micro-benchmark of the router's per-request body work: decode + the upstream body.

``python -m bench.decode_micro`` times, for a typical chat body (system prompt, three turns,
sampling fields, a stream), the parse of the client's JSON into what the router reads plus
the build of the upstream body (max_tokens, include_usage set; re-encoded). It runs against
whichever ``runtime.gateway.schema`` is importable, so running it on two checkouts compares
two versions (before/after numbers in README "What the router forwards").
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

import msgspec

from runtime.gateway import schema

TYPICAL_CHAT: dict[str, Any] = {
    "model": "tiny-llama",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. " * 8},
        {"role": "user", "content": "What is the capital of France? Answer briefly. " * 3},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Germany?"},
    ],
    "max_tokens": 64,
    "temperature": 0.7,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def _current(body: bytes) -> Callable[[], bytes]:
    decoder = schema.RequestDecoder(schema.ChatRequest)
    encoder = msgspec.json.Encoder()

    def run() -> bytes:
        decoded = decoder.decode(body)
        decoded.request.texts()
        document = decoded.document
        document["max_tokens"] = 64
        document["stream_options"] = {"include_usage": True}
        return encoder.encode(document)

    return run


def _strict(body: bytes) -> Callable[[], bytes]:  # the schema before issue #9
    decoder = msgspec.json.Decoder(schema.ChatRequest)
    forwardable: Any = getattr(schema, "forwardable")  # noqa: B009 - absent after #9
    decode: Any = schema.decode_request

    def run() -> bytes:
        request = decode(body, decoder)
        request.texts()
        document = forwardable(request)
        document["max_tokens"] = 64
        document["stream"] = True
        document["stream_options"] = {"include_usage": True}
        return msgspec.json.encode(document)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    body = msgspec.json.encode(TYPICAL_CHAT)
    run = _current(body) if hasattr(schema, "RequestDecoder") else _strict(body)
    best = min(timeit.repeat(run, number=args.number, repeat=args.repeat)) / args.number
    which = "forwarding" if hasattr(schema, "RequestDecoder") else "strict"
    print(f"{which}: decode + upstream body, {len(body)}-byte chat body: {best * 1e6:.2f} us")  # noqa: T201


if __name__ == "__main__":
    main()
