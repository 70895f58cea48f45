"""CPU the cache's encryption at rest adds per L2 store and per L2 hit (runtime/cache/sealing.py).

``python -m bench.cache_seal_micro [--iterations 20000]`` measures with ``time.process_time``
(CPU, not wall), for entries of a short, a typical and a long answer (the stored entry of a
unary chat completion: its chunks and its raw JSON body):

- a store: the entry encoded (msgpack), then sealed (AES-GCM, the tenant's derived key, the
  Redis key as associated data) — the seal is what encryption adds;
- an L2 hit: the value opened, then decoded — the open is what encryption adds;
- an L1 hit pays nothing: L1 keeps the decoded entry in process.

Redis round trips are left out (they are the same with or without encryption; the value grows
by the header, nonce and tag: 4 + 1 + key id + 12 + 16 bytes).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import msgspec

from runtime.cache.entry import CachedUsage, Entry, decode_entry, encode_entry
from runtime.cache.sealing import Sealer
from runtime.contract import cache_entry_key
from runtime.crypto import Keyring, generate_key

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "the",
         "router", "keeps", "its", "cache", "warm")  # fmt: skip
REDIS_KEY = cache_entry_key("switchyard", "acme", "sha256:" + "a" * 64, "b" * 64)


def entry_of(tokens: int) -> Entry:
    """The entry of a unary answer of about ``tokens`` tokens (~4 characters each)."""
    text = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
    body = msgspec.json.encode({
        "id": "chatcmpl-0123456789", "object": "chat.completion", "created": 1_700_000_000,
        "model": "demo-llama", "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": tokens, "total_tokens": 40 + tokens},
    })  # fmt: skip
    return Entry(kind="chat", id="chatcmpl-0123456789", created=1_700_000_000,
                 model="demo-llama", chunks=(text,), finish_reason="stop",
                 usage=CachedUsage(40, tokens, 40 + tokens), body=body)  # fmt: skip


def _cpu_us(fn: Callable[[], object], iterations: int) -> float:
    fn()
    start = time.process_time()
    for _ in range(iterations):
        fn()
    return (time.process_time() - start) / iterations * 1e6


def measure(tokens: int, iterations: int) -> dict[str, float]:
    sealer = Sealer(Keyring.from_spec(f"k1:{generate_key()}"))
    entry = entry_of(tokens)
    raw = encode_entry(entry)
    sealed = sealer.seal(raw, "acme", REDIS_KEY)
    return {
        "bytes": float(len(raw)),
        "sealed_bytes": float(len(sealed)),
        "encode_us": _cpu_us(lambda: encode_entry(entry), iterations),
        "seal_us": _cpu_us(lambda: sealer.seal(raw, "acme", REDIS_KEY), iterations),
        "decode_us": _cpu_us(lambda: decode_entry(raw), iterations),
        "open_us": _cpu_us(lambda: sealer.open(sealed, "acme", REDIS_KEY), iterations),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args(argv)
    print("answer   entry B  sealed B   store: encode + seal    L2 hit: open + decode   (us CPU)")
    for tokens in (16, 256, 2048):
        m = measure(tokens, args.iterations)
        print(f"{tokens:5d} tok {m['bytes']:8.0f} {m['sealed_bytes']:8.0f}   "
              f"{m['encode_us']:6.2f} + {m['seal_us']:6.2f}         "
              f"{m['open_us']:6.2f} + {m['decode_us']:6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
