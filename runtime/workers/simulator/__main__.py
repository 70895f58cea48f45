"""Command line: ``python -m runtime.workers.simulator --port 8100 --model NAME [...]``."""

from __future__ import annotations

import argparse
import logging
import ssl
from collections.abc import Sequence
from pathlib import Path

from runtime.procs import watch_lifeline
from runtime.tls import ServerTLS, TLSConfigError
from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.prefix_cache import PrefixCacheConfig
from runtime.workers.simulator.server import run
from runtime.workers.simulator.timing import Capacity, TimingModel

DESCRIPTION = """\
vLLM-compatible SIMULATOR for tests and benchmarks on machines without GPUs. It runs no model
and is never a production backend. It serves vLLM's OpenAI-compatible API (/v1/models,
/v1/completions, /v1/chat/completions, /v1/embeddings, /health) and vLLM's /metrics names,
with a timing model: each engine step lasts new_prompt_tokens/prefill_tps seconds plus
(decode_a_ms + decode_b_ms * batch_size) milliseconds and gives every running sequence one
token; at most --max-num-seqs sequences run, each reserving prompt + max_tokens of the
--kv-capacity-tokens KV cache; the rest wait in a queue ordered by priority (lower first),
then arrival. Tokens are counted as ceil(characters / 4); output is deterministic pseudo-words.
Prefix caching (as vLLM's, on by default): a prompt's full blocks of --block-size tokens are
hashed in a chain and kept in an LRU cache of --prefix-cache-blocks blocks; cached prompt
tokens are not prefilled again (vllm:prefix_cache_queries / vllm:prefix_cache_hits). A
sequence leaving the batch caches the blocks of its prompt followed by its generated text, so a
resumed stream's continuation (continue_final_message) hits them on the same simulator.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.workers.simulator",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    add("--port", type=int, default=8000, help="port to bind (default: %(default)s)")
    add("--model", required=True, help="served model name (requests must use it)")
    add("--prefill-tps", type=float, default=5000.0, help="prefill tokens/s (default: 5000)")
    add("--decode-a-ms", type=float, default=10.0, help="decode step fixed ms (default: 10)")
    add("--decode-b-ms", type=float, default=0.5, help="decode step ms per sequence (default: 0.5)")
    add("--max-num-seqs", type=int, default=64, help="max running sequences (default: 64)")
    add("--kv-capacity-tokens", type=int, default=65536, help="KV cache tokens (default: 65536)")
    add("--max-model-len", type=int, default=4096, help="context length (default: 4096)")
    add("--block-size", type=int, default=16, help="tokens per KV block (default: 16)")
    add(
        "--prefix-cache-blocks",
        type=int,
        default=None,
        metavar="N",
        help="prefix cache size in blocks, 0 turns caching off "
        "(default: kv-capacity-tokens / block-size)",
    )
    add(
        "--kv-events-endpoint",
        default=None,
        metavar="URL",
        help="publish the prefix cache's KV events (vLLM's format) on a ZeroMQ PUB socket "
        "bound here, e.g. tcp://127.0.0.1:5557 (default: off)",
    )
    add("--max-loras", type=int, default=0, help="LoRA adapters loadable at once, 0 = off")
    add(
        "--max-cpu-loras",
        type=int,
        default=0,
        help="LoRA adapters kept loaded (default: --max-loras, as vLLM)",
    )
    add("--lora-load-ms", type=float, default=50.0, help="one adapter load (default: 50)")
    add("--embedding-dim", type=int, default=384, help="embedding size (default: 384)")
    add("--seed", type=int, default=0, help="seed of the generated text (default: 0)")
    add(
        "--fail-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="fault injection: cut the connection of every generation after N tokens",
    )
    add(
        "--error-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="fault injection: answer this fraction of generations with HTTP 500 (default: 0)",
    )
    add("--log-level", default="INFO", help="logging level (default: %(default)s)")
    # vLLM's TLS flags (runtime.workers.launch.tls_args)
    add("--ssl-certfile", type=Path, default=None, help="serve HTTPS with this certificate")
    add("--ssl-keyfile", type=Path, default=None, help="the certificate's key")
    add("--ssl-ca-certs", type=Path, default=None, help="CA of the client certificates")
    add(
        "--ssl-cert-reqs",
        type=int,
        default=int(ssl.CERT_NONE),
        choices=[int(ssl.CERT_NONE), int(ssl.CERT_REQUIRED)],
        help="2: refuse clients without a certificate signed by --ssl-ca-certs (default 0)",
    )
    return parser


def tls_from_args(args: argparse.Namespace) -> ServerTLS | None:
    if args.ssl_certfile is None:
        return None
    required = args.ssl_cert_reqs == ssl.CERT_REQUIRED
    if required and args.ssl_ca_certs is None:
        raise ValueError("--ssl-cert-reqs 2 needs --ssl-ca-certs")
    return ServerTLS(
        args.ssl_certfile,
        args.ssl_keyfile or args.ssl_certfile,
        client_ca=args.ssl_ca_certs if required else None,
        cert_var="--ssl-certfile",
    )


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    return SimulatorConfig(
        model=args.model,
        timing=TimingModel(
            prefill_tps=args.prefill_tps,
            decode_a_ms=args.decode_a_ms,
            decode_b_ms=args.decode_b_ms,
        ),
        capacity=Capacity(
            max_num_seqs=args.max_num_seqs, kv_capacity_tokens=args.kv_capacity_tokens
        ),
        max_model_len=args.max_model_len,
        seed=args.seed,
        fail_after_tokens=args.fail_after_tokens,
        error_rate=args.error_rate,
        embedding_dim=args.embedding_dim,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        lora_load_ms=args.lora_load_ms,
        kv_events_endpoint=args.kv_events_endpoint,
        prefix_cache=PrefixCacheConfig(
            block_size=args.block_size,
            capacity_blocks=(
                args.kv_capacity_tokens // max(args.block_size, 1)
                if args.prefix_cache_blocks is None
                else args.prefix_cache_blocks
            ),
        ),
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        tls = tls_from_args(args)
        context = None if tls is None else tls.context()
    except (ValueError, TLSConfigError) as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    logging.getLogger(__name__).info(
        "simulator (no GPU, not a production backend) serving %s on %s://%s:%d",
        config.model,
        "http" if context is None else "https",
        args.host,
        args.port,
    )
    watch_lifeline()  # started by `up`'s autoscaler: stop once `up` is gone
    run(config, host=args.host, port=args.port, ssl_context=context)


if __name__ == "__main__":
    main()
