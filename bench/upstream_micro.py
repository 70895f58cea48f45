"""CPU per upstream request of the router's client (issue #27): open a streamed chat
completion on a simulator backend (another process) with each client of ``--clients``
(``SWITCHYARD_UPSTREAM_CLIENT``'s kinds, :mod:`runtime.upstream.choice`), relay it into a sink
that drops the bytes (:func:`relay_stream`, as the relay stage does), ``--requests`` times one
after another; ``time.process_time`` of this process per request (the simulator's CPU is its
own). The clients alternate within every round, so a machine's load drifts over all of them
alike. Best and median of ``--rounds`` rounds per client, in microseconds, and each client's
median over the first's.

``python -m bench.upstream_micro [--requests 2000] [--rounds 5] [--tokens 8]
[--clients aiohttp,lean]``
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
from runtime.upstream.choice import CLIENTS, new_client


class _Sink:
    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        return None

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        return None


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    scenario = load(SCENARIO)
    spec = dataclasses.replace(scenario.backends, count=1)
    work = Path(tempfile.mkdtemp(prefix="switchyard-upstream-micro-"))
    session = aiohttp.ClientSession()
    backends = await start_backends(spec, session=session, log_dir=work, cpus=(),
                                    timeout_s=60.0)  # fmt: skip
    config = ClientConfig(timeouts=TimeoutPolicy(first_byte_cap=10.0))
    clients = {kind: new_client(kind, config) for kind in args.clients}
    endpoint = EndpointSnap(id=1, pool="p", version=1, base_url=backends[0].base_url,
                            state="ready", capacity=256)  # fmt: skip
    body = (b'{"model":"' + spec.model.encode() + b'","messages":[{"role":"user","content":'
            b'"hello there"}],"max_tokens":' + str(args.tokens).encode()
            + b',"stream":true,"stream_options":{"include_usage":true}}')  # fmt: skip
    metrics, labels, sink = RouterMetrics(), StageLabels(model="m"), _Sink()
    loop = asyncio.get_running_loop()

    async def one(client: UpstreamClient) -> None:
        upstream = await client.open_stream(
            endpoint, "/v1/chat/completions", body, deadline=loop.time() + 30.0,
            headers={"X-Request-Id": "r-1"},
        )  # fmt: skip
        await relay_stream(sink, upstream, kind="chat", include_usage=True, headers=(),
                           metrics=metrics, labels=labels)  # fmt: skip

    figures: dict[str, list[float]] = {kind: [] for kind in clients}
    try:
        for client in clients.values():
            for _ in range(50):
                await one(client)
        for _ in range(args.rounds):
            for kind, client in clients.items():
                start = time.process_time()
                for _ in range(args.requests):
                    await one(client)
                figures[kind].append((time.process_time() - start) / args.requests * 1e6)
    finally:
        for client in clients.values():
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
    parser.add_argument("--clients", type=_kinds, default=["aiohttp", "lean"],
                        help=f"comma-separated, of {', '.join(CLIENTS)}")  # fmt: skip
    figures = asyncio.run(run(parser.parse_args()))
    base = statistics.median(next(iter(figures.values())))
    for kind, rounds in figures.items():
        median = statistics.median(rounds)
        print(f"{kind}: upstream request + relay, CPU us per request: best {min(rounds):.1f}, "
              f"median {median:.1f} ({median / base:.2f}x; rounds: "
              f"{' / '.join(f'{f:.1f}' for f in rounds)})")  # fmt: skip


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in CLIENTS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"clients must be of {', '.join(CLIENTS)}")
    return kinds


if __name__ == "__main__":
    main()
