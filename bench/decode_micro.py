"""Micro-benchmark of the router's per-request body work: decode + the upstream body.

``python -m bench.decode_micro`` times, for a typical chat body (system prompt, three turns,
sampling fields, a stream), the parse of the client's JSON into what the router reads plus
the build of the upstream body (max_tokens, include_usage set; re-encoded).
``--before path/to/old/schema.py`` loads an older ``runtime/gateway/schema.py`` (e.g. from a
``git worktree`` of an earlier commit) and times both in this process, interleaved, so a busy
machine affects both alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import timeit
from collections.abc import Callable
from types import ModuleType
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


def _current(body: bytes, module: Any = schema) -> Callable[[], bytes]:
    decoder = module.RequestDecoder(module.ChatRequest)
    encoder = msgspec.json.Encoder()

    def run() -> bytes:
        decoded = decoder.decode(body)
        decoded.request.texts()
        document = decoded.document
        document["max_tokens"] = 64
        document["stream_options"] = {"include_usage": True}
        return encoder.encode(document)

    return run


def _strict(body: bytes, module: Any) -> Callable[[], bytes]:  # the schema before issue #9
    decoder = msgspec.json.Decoder(module.ChatRequest)
    forwardable: Any = module.forwardable
    decode: Any = module.decode_request

    def run() -> bytes:
        request = decode(body, decoder)
        request.texts()
        document = forwardable(request)
        document["max_tokens"] = 64
        document["stream"] = True
        document["stream_options"] = {"include_usage": True}
        return msgspec.json.encode(document)

    return run


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("schema_before", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the annotations through it
    spec.loader.exec_module(module)
    return module


def _runner(body: bytes, module: Any) -> Callable[[], bytes]:
    return _current(body, module) if hasattr(module, "RequestDecoder") else _strict(body, module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--before", help="an older runtime/gateway/schema.py to compare with")
    args = parser.parse_args()
    body = msgspec.json.encode(TYPICAL_CHAT)
    runs = {"after": _runner(body, schema)}
    if args.before:
        runs["before"] = _runner(body, _load(args.before))
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeat):
        for name, run in runs.items():
            best[name] = min(best[name], timeit.timeit(run, number=args.number) / args.number)
    for name, seconds in best.items():
        print(f"{name}: decode + upstream body, {len(body)}-byte chat: {seconds * 1e6:.2f} us")


if __name__ == "__main__":
    main()
