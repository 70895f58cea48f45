"""CPU per upstream request of the router's client (issue #27): open a streamed chat
completion on a simulator backend (another process) with :class:`UpstreamClient`, relay it
into a sink that drops the bytes (:func:`relay_stream`, as the relay stage does), ``--requests``
times one after another; ``time.process_time`` of this process per request (the simulator's
CPU is its own). Best and median of ``--rounds`` rounds, in microseconds.

``python -m bench.upstream_micro [--requests 2000] [--rounds 5] [--tokens 8]``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import aiohttp

from bench.backends import start_backends
from bench.scenario import load
from bench.tls_micro import SCENARIO
from runtime.gateway.relay import relay_stream
from runtime.snapshot import EndpointSnap
from runtime.telemetry.metrics import RouterMetrics, StageLabels
from runtime.upstream import ClientConfig, TimeoutPolicy, UpstreamClient


class _Sink:
    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        return None

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        return None


async def run(args: argparse.Namespace) -> list[float]:
    scenario = load(SCENARIO)
    spec = dataclasses.replace(scenario.backends, count=1)
    work = Path(tempfile.mkdtemp(prefix="switchyard-upstream-micro-"))
    session = aiohttp.ClientSession()
    backends = await start_backends(spec, session=session, log_dir=work, cpus=(),
                                    timeout_s=60.0)  # fmt: skip
    client = UpstreamClient(ClientConfig(timeouts=TimeoutPolicy(first_byte_cap=10.0)))
    endpoint = EndpointSnap(id=1, pool="p", version=1, base_url=backends[0].base_url,
                            state="ready", capacity=256)  # fmt: skip
    body = (b'{"model":"' + spec.model.encode() + b'","messages":[{"role":"user","content":'
            b'"hello there"}],"max_tokens":' + str(args.tokens).encode()
            + b',"stream":true,"stream_options":{"include_usage":true}}')  # fmt: skip
    metrics, labels, sink = RouterMetrics(), StageLabels(model="m"), _Sink()
    loop = asyncio.get_running_loop()

    async def one() -> None:
        upstream = await client.open_stream(
            endpoint, "/v1/chat/completions", body, deadline=loop.time() + 30.0,
            headers={"X-Request-Id": "r-1"},
        )  # fmt: skip
        await relay_stream(sink, upstream, kind="chat", include_usage=True, headers=(),
                           metrics=metrics, labels=labels)  # fmt: skip

    figures = []
    try:
        for _ in range(50):
            await one()
        for _ in range(args.rounds):
            start = time.process_time()
            for _ in range(args.requests):
                await one()
            figures.append((time.process_time() - start) / args.requests * 1e6)
    finally:
        await client.close()
        for child in backends:
            await asyncio.to_thread(child.stop)
        await session.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream_micro", description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=8, help="max_tokens of each request")
    figures = asyncio.run(run(parser.parse_args()))
    print(f"upstream request + relay, CPU us per request: best {min(figures):.1f}, median "
          f"{statistics.median(figures):.1f} (rounds: {' / '.join(f'{f:.1f}' for f in figures)})")


if __name__ == "__main__":
    main()
