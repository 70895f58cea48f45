"""A router with ``--workers 2`` loses no usage when a worker is killed during a Redis outage
(issue #27 item 6).

Real parts: a simulator engine, a private redis-server (append-only, killed and started again),
a real ``python -m runtime.gateway --workers 2``. Redis is killed; requests are answered from
the local fallback by both workers, their settlements spooled; one worker gets ``kill -9``
(uvicorn starts a new one, which claims the dead worker's spool slot); more requests are
answered; Redis comes back; the router is restarted. Then every answered request has exactly
one usage event in the stream (counted by event id: no duplicates, none missing). The stream,
not the ledger, is counted: the ledger consumer drops a repeated event id, so it would hide a
duplicate.

With the old shared spool directory the two workers' rotations overwrote each other's segments
(both numbered them from the same count), and the killed worker's lost ones were gone.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import pytest
import redis
from fixtures.private_redis import PrivateRedis
from fixtures.router import Process, Publisher, World, start_router, start_simulator, wait_ready
from fixtures.wait import eventually
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from runtime.admission.redis_limits import Settlement
from runtime.contract import credit_key
from runtime.metering.events import decode_event
from runtime.procs import cmdline, descendant_pids, pid_alive
from runtime.snapshot import PriceSnap, TenantLimits

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "spool-chat"
PRICE = PriceSnap(version=1, hardware_tier="cpu", input_per_1k=1.0, output_per_1k=2.0,
                  cache_hit_discount=0.5)  # fmt: skip
BATCH = 8  # concurrent requests, each on its own connection: both workers get some
ROUNDS = 25  # bound on batches until both workers have spooled requests
BOTH_SERVE_WITHIN_S = 60.0  # the kernel hands each connection to whichever worker accepts


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    sim = start_simulator(MODEL, "--decode-a-ms", "2")
    yield sim
    sim.stop()


def spooled(var_dir: Path) -> dict[Path, set[str]]:
    """Request ids of the usage events in each spool directory's files (slots, and the root
    where the old layout wrote)."""
    root = var_dir / "usage-spool"
    found: dict[Path, set[str]] = {}
    if not root.is_dir():
        return found
    for directory in [root, *(p for p in root.iterdir() if p.is_dir())]:
        ids: set[str] = set()
        for path in directory.glob("*.jsonl"):
            try:
                lines = path.read_bytes().splitlines()
            except FileNotFoundError:  # rotated or discarded meanwhile
                continue
            for line in lines:
                try:
                    item = msgspec.json.decode(line, type=Settlement)
                except msgspec.DecodeError:
                    continue  # torn: being written
                if item.event:
                    ids.add(decode_event(item.event.encode()).request_id)
        found[directory] = ids
    return found


def served_by(metrics_dir: Path) -> set[str]:
    """The workers' metric files (prometheus multiprocess, one per pid) that count a request."""
    found: set[str] = set()
    for path in metrics_dir.glob("counter_*.db"):
        with tempfile.TemporaryDirectory() as alone:
            (Path(alone) / path.name).write_bytes(path.read_bytes())
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=alone)
            if any(sample.name == "switchyard_requests_total" and sample.value > 0
                   for metric in registry.collect() for sample in metric.samples):  # fmt: skip
                found.add(path.name)
    return found


def not_requests(router: Process) -> str:
    """The router's log without its request lines (for a failure message)."""
    lines = router.output().splitlines()
    return "\n".join(line for line in lines if '"switchyard.requests"' not in line)[-4000:]


def workers(router: Process) -> list[int]:
    """The router's uvicorn workers (multiprocessing's spawned children)."""
    return [pid for pid in descendant_pids(router.pid) if "spawn_main" in cmdline(pid)]


def holder(slot: Path) -> int:
    """The pid the slot's lock file names (0: none)."""
    try:
        return int((slot / "lock").read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def test_kill_9_of_a_worker_during_a_redis_outage_bills_every_request_once(
    engine: Process, tmp_path: Path
) -> None:
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    publisher = Publisher(f"switchyard:test:spool:{uuid.uuid4().hex[:10]}", server.url)
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, engine.base_url, pool="cpu", capacity=256)
    world.add_tenant("payer", tenant_limits=TenantLimits(
        rpm=100_000, tpm=10**9, max_concurrency=10_000, max_context_tokens=4096,
        max_output_tokens=512,
    ))  # fmt: skip
    key = world.add_key("payer", "payer")
    var_dir = tmp_path / "router"
    routers: list[Process] = []
    try:
        version = publisher.publish(msgspec.structs.replace(world.snapshot(), prices=(PRICE,)))
        metrics_dir = tmp_path / "prometheus"
        env = {"REDIS_URL": server.url, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        router = start_router(publisher.prefix, var_dir, workers=2, **env)
        routers.append(router)
        wait_ready(router, version)
        headers = {"Authorization": f"Bearer {key}", "Cache-Control": "no-store",
                   "Connection": "close"}  # fmt: skip
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answered: list[str] = []
        statuses: Counter[int] = Counter()  # for the failure messages

        def post(_: int = 0) -> str | None:
            url = f"{routers[-1].base_url}/v1/chat/completions"
            try:
                reply = httpx.post(url, json=body, headers=headers, timeout=30)
            except httpx.HTTPError:
                return None
            statuses[reply.status_code] += 1
            return reply.headers["x-request-id"] if reply.status_code == 200 else None

        def batch() -> list[str]:
            with ThreadPoolExecutor(BATCH) as pool:
                ids = [i for i in pool.map(post, range(BATCH)) if i is not None]
            answered.extend(ids)
            return ids

        stream = f"{publisher.prefix}:usage"

        def events() -> list[tuple[str, str]]:
            """(event id, request id) of every usage event in the stream."""
            client: redis.Redis[bytes] = redis.Redis.from_url(server.url)
            try:
                out = []
                for _id, fields in client.xrange(stream):
                    event = decode_event(fields[b"event"])
                    out.append((event.id, event.request_id))
                return out
            finally:
                client.close()

        funds: redis.Redis[bytes] = redis.Redis.from_url(server.url)
        funds.hset(credit_key(f"{publisher.prefix}:limits", "payer"), "balance", 10**12)
        funds.close()
        eventually(lambda: len(workers(router)) >= 2, timeout=60, what="both workers up")
        deadline = time.monotonic() + BOTH_SERVE_WITHIN_S
        for _ in range(4 * ROUNDS):  # Redis up: billed at once; both workers learn the
            assert len(batch()) == BATCH  # balance (the outage's share is a quarter of it)
            if len(served_by(metrics_dir)) >= 2 or time.monotonic() > deadline:
                break
        assert len(served_by(metrics_dir)) >= 2, "one worker served everything"
        eventually(lambda: set(answered) <= {r for _e, r in events()}, timeout=30,
                   what="the first events in the stream")  # fmt: skip

        server.kill()  # the outage: both workers answer from the local fallback and spool
        during: set[str] = set()
        for _ in range(ROUNDS):
            during.update(batch())
            slots = spooled(var_dir)
            if sum(1 for d, ids in slots.items() if d.name.isdigit() and ids & during) >= 2:
                break
        assert during, "nothing was answered during the outage"
        slots = eventually(
            lambda: (s := spooled(var_dir)) and during <= set().union(*s.values()) and s,
            timeout=30, what="every answered request's settlement in the spool",
        )  # fmt: skip
        busy = [d for d, ids in slots.items() if d.name.isdigit() and ids & during]
        if busy:  # a worker holding spooled, unbilled usage
            victim = holder(busy[0])
        else:  # no slots (the old shared directory): a worker that served
            served = sorted(int(name[8:-3]) for name in served_by(metrics_dir))
            victim = next((pid for pid in served if pid_alive(pid)), 0)
        assert victim in workers(router), (victim, workers(router))

        os.kill(victim, signal.SIGKILL)  # its in-memory batch dies with it; the spool stays
        eventually(lambda: not pid_alive(victim), timeout=10, what="the worker to die")
        eventually(lambda: len(set(workers(router)) - {victim}) >= 2, timeout=60,
                   what="uvicorn's replacement worker")  # fmt: skip
        after: set[str] = set()
        for _ in range(ROUNDS):  # the new worker, in the outage still
            after.update(batch())
            if len(after) >= BATCH:
                break
        assert after, "nothing was answered after the kill"

        server.start()  # back (append-only: what it had before the outage is there)
        eventually(lambda: set(answered) <= {r for _e, r in events()}, timeout=60,
                   what="every answered request's event in the stream")  # fmt: skip

        router.stop()  # a restart replays whatever is left, and must add nothing twice
        router = start_router(publisher.prefix, var_dir, workers=2, **env)
        routers.append(router)
        wait_ready(router, version)
        eventually(lambda: not any(spooled(var_dir).values()), timeout=30,
                   what="the spool to drain after the restart")  # fmt: skip

        seen = events()
        by_event = Counter(event_id for event_id, _r in seen)
        assert [e for e, n in by_event.items() if n > 1] == []  # none twice
        requests = Counter(request_id for _e, request_id in seen)
        assert [r for r, n in requests.items() if n > 1] == []
        assert set(requests) == set(answered)  # none missing, none invented
        assert len(seen) == len(answered)
    except AssertionError as exc:  # with what the router said (its request lines left out)
        log = not_requests(routers[-1]) if routers else ""
        raise AssertionError(f"{exc}\nrouter log:\n{log}") from None
    finally:
        for process in routers:
            process.stop()
        publisher.client.close()  # a private server: nothing to clean up in it
        server.stop()
