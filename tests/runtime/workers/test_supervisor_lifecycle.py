"""The supervisor's life cycle against a real simulator process and real Redis.

ready (heartbeat key with a TTL) → stop → draining while a stream is in flight → the stream
completes → engine stopped → heartbeat deleted → gone; the grace period bounds the drain; a
second stop ends it at once; an engine that dies on its own makes the endpoint gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time

import aiohttp
import pytest
import redis
from fixtures.net import free_port
from fixtures.wait import async_eventually

from runtime.artifacts import compute_manifest
from runtime.procs import pid_alive
from runtime.workers.heartbeat import endpoint_heartbeat_key
from runtime.workers.launch import WATCH_SETTLE_S, WorkerSpec
from runtime.workers.supervisor import EngineExitedError, Supervisor, SupervisorSettings

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

ENDPOINT_ID = 990_001
TTL_S = 6.0


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.events = {name: asyncio.Event() for name in ("ready", "draining", "unhealthy", "gone")}
        self.at: dict[str, list[float]] = {}
        self.reasons: list[str] = []

    async def on_starting(self, base_url: str) -> int | None:
        self.calls.append("starting")
        return ENDPOINT_ID

    async def on_ready(self) -> None:
        self._mark("ready")

    async def on_draining(self) -> None:
        self._mark("draining")

    async def on_unhealthy(self, reason: str) -> None:
        self.reasons.append(reason)
        self._mark("unhealthy")

    async def on_gone(self) -> None:
        self._mark("gone")

    def _mark(self, name: str) -> None:
        self.calls.append(name)
        self.at.setdefault(name, []).append(time.monotonic())
        self.events[name].set()


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    client.delete(endpoint_heartbeat_key(ENDPOINT_ID))
    yield client
    client.delete(endpoint_heartbeat_key(ENDPOINT_ID))
    client.close()


@pytest.fixture
def spec(tmp_path) -> WorkerSpec:
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"weights")
    digest, files = compute_manifest(folder)
    return WorkerSpec(
        artifact_dir=folder,
        expected_digest=digest,
        expected_files=files,
        served_model_name="sim",
        port=free_port(),
        backend="simulator",
        extra_args=("--decode-a-ms", "20", "--decode-b-ms", "0"),  # 50 tokens/s per stream
    )


def make_supervisor(spec, hooks, tmp_path, **settings) -> Supervisor:
    return Supervisor(
        spec,
        hooks=hooks,
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        settings=SupervisorSettings(
            heartbeat_ttl_s=TTL_S,
            handle_signals=False,
            engine_log=tmp_path / "engine.log",
            **settings,
        ),
    )


def heartbeat(client) -> dict | None:
    raw = client.get(endpoint_heartbeat_key(ENDPOINT_ID))
    return None if raw is None else json.loads(raw)


async def wait_event(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), 30.0)


async def stream_completion(session, spec, max_tokens: int, first_chunk: asyncio.Event):
    """Stream a completion; return (its SSE data lines, whether it ended with [DONE])."""
    body = {"model": "sim", "prompt": "x", "max_tokens": max_tokens, "stream": True}
    lines: list[str] = []
    try:
        async with session.post(f"{spec.base_url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    lines.append(line[6:])
                    first_chunk.set()
    except aiohttp.ClientPayloadError:
        pass  # cut by the engine stopping
    return lines, bool(lines) and lines[-1] == "[DONE]"


async def test_ready_heartbeat_then_drain_lets_the_stream_finish(spec, tmp_path, redis_client):
    hooks = Recorder()
    supervisor = make_supervisor(spec, hooks, tmp_path, grace_s=30.0)
    run = asyncio.create_task(supervisor.run())
    await wait_event(hooks.events["ready"])

    beat = heartbeat(redis_client)
    assert beat is not None
    assert beat["state"] == "ready"
    assert beat["endpoint"] == ENDPOINT_ID
    assert beat["base_url"] == spec.base_url
    assert 0 < redis_client.pttl(endpoint_heartbeat_key(ENDPOINT_ID)) <= TTL_S * 1000
    engine_pid = supervisor.engine.pid

    async with aiohttp.ClientSession() as session:
        first = asyncio.Event()
        stream = asyncio.create_task(stream_completion(session, spec, 60, first))  # ~1.2 s
        await wait_event(first)
        started = time.monotonic()
        supervisor.request_stop()
        await wait_event(hooks.events["draining"])
        assert heartbeat(redis_client)["state"] == "draining"
        assert not stream.done()  # still streaming while the endpoint drains
        lines, done = await asyncio.wait_for(stream, 30)

    await asyncio.wait_for(run, 30)
    assert done, lines[-3:]
    final = json.loads(lines[-2])
    assert final["choices"][0]["finish_reason"] == "length"
    assert time.monotonic() - started < 15
    assert hooks.calls == ["starting", "ready", "draining", "gone"]
    assert heartbeat(redis_client) is None
    assert not pid_alive(engine_pid)


async def test_grace_period_bounds_the_drain(spec, tmp_path, redis_client):
    hooks = Recorder()
    # The simulator, like vLLM, waits for open streams on SIGTERM: stop_timeout_s bounds that.
    supervisor = make_supervisor(spec, hooks, tmp_path, grace_s=0.5, stop_timeout_s=2.0)
    run = asyncio.create_task(supervisor.run())
    await wait_event(hooks.events["ready"])
    async with aiohttp.ClientSession() as session:
        first = asyncio.Event()
        stream = asyncio.create_task(stream_completion(session, spec, 1500, first))  # ~30 s
        await wait_event(first)
        started = time.monotonic()
        supervisor.request_stop()
        await asyncio.wait_for(run, 30)
        elapsed = time.monotonic() - started
        _, done = await asyncio.wait_for(stream, 10)
    assert not done  # cut: grace period, then SIGTERM, then SIGKILL
    assert 2.5 <= elapsed < 8
    assert hooks.calls == ["starting", "ready", "draining", "gone"]
    assert heartbeat(redis_client) is None


async def test_second_stop_request_ends_the_drain_at_once(spec, tmp_path, redis_client):
    hooks = Recorder()
    supervisor = make_supervisor(spec, hooks, tmp_path, grace_s=60.0, stop_timeout_s=2.0)
    run = asyncio.create_task(supervisor.run())
    await wait_event(hooks.events["ready"])
    async with aiohttp.ClientSession() as session:
        first = asyncio.Event()
        stream = asyncio.create_task(stream_completion(session, spec, 1500, first))
        await wait_event(first)
        started = time.monotonic()
        supervisor.request_stop()
        await wait_event(hooks.events["draining"])
        supervisor.request_stop()
        await asyncio.wait_for(run, 30)
        assert time.monotonic() - started < 8  # far less than the 60 s grace
        await asyncio.wait_for(stream, 10)
    assert hooks.calls == ["starting", "ready", "draining", "gone"]


def with_sidekick(spec: WorkerSpec, tmp_path, body: str = "") -> WorkerSpec:
    """The engine started through a shell that first runs ``body`` and leaves a second engine
    process (``sleep``) in the group, as vLLM's engine core is."""
    script = tmp_path / "engine-python"
    script.write_text(f'#!/bin/sh\n{body}\nsleep 300 &\nexec {spec.python} "$@"\n')
    script.chmod(0o755)
    return dataclasses.replace(spec, python=str(script))


async def wait_for_call(hooks: Recorder, name: str, count: int) -> None:
    await async_eventually(lambda: hooks.calls.count(name) >= count, timeout=60, what=name)


async def test_death_of_any_engine_process_restarts_it_after_a_fresh_warmup(
    spec, tmp_path, redis_client
):
    hooks = Recorder()
    supervisor = make_supervisor(with_sidekick(spec, tmp_path), hooks, tmp_path)
    run = asyncio.create_task(supervisor.run())
    await wait_event(hooks.events["ready"])
    first_start = heartbeat(redis_client)["started"]  # routers forget adapters when it changes
    first = supervisor.engine
    members = first.members()
    sidekick = next(pid for pid in members if pid != first.pid)
    await asyncio.sleep(WATCH_SETTLE_S)  # the scenario: a failure once it serves, not a helper
    killed_at = time.monotonic()
    os.kill(sidekick, signal.SIGKILL)  # not the leader: no pipe closes, nothing exits

    await wait_event(hooks.events["unhealthy"])
    detected_s = hooks.at["unhealthy"][0] - killed_at
    assert detected_s < 1.0, f"death seen after {detected_s:.2f} s"
    assert str(sidekick) in hooks.reasons[0]
    await wait_for_call(hooks, "ready", 2)
    recovered_s = hooks.at["ready"][1] - killed_at
    second = supervisor.engine
    assert second is not first
    assert not [pid for pid in members if pid_alive(pid)]  # the old group is gone whole
    assert heartbeat(redis_client)["state"] == "ready"
    assert heartbeat(redis_client)["started"] > first_start  # a new engine start
    async with (  # the new engine was warmed up afresh
        aiohttp.ClientSession() as session,
        session.get(f"{spec.base_url}/metrics") as resp,
    ):
        text = await resp.text()
    assert metric(text, "vllm:generation_tokens_total") >= 1.0
    print(f"\nengine death seen in {detected_s:.2f} s, serving again after {recovered_s:.2f} s")

    supervisor.request_stop()
    await asyncio.wait_for(run, 30)
    assert hooks.calls == ["starting", "ready", "unhealthy", "ready", "draining", "gone"]
    assert not [pid for pid in second.members() | members if pid_alive(pid)]
    assert heartbeat(redis_client) is None


async def test_after_a_death_the_rest_of_the_group_is_killed_without_a_long_grace(
    spec, tmp_path, redis_client
):
    """kill -9 of the leader (vLLM's API server) leaves a process that ignores SIGTERM (vLLM's
    engine core took ~10 s): it is SIGKILLed after ``dead_stop_timeout_s`` (1 s), not after
    the drain-time ``stop_timeout_s`` (15 s), so the restart starts at once."""
    hooks = Recorder()
    once = tmp_path / "deaf-started"  # only the first engine gets the SIGTERM-deaf process
    deaf = f"[ -e {once} ] || {{ touch {once}; (trap '' TERM; exec sleep 301) & }}"
    sidekick_spec = with_sidekick(spec, tmp_path, body=deaf)
    supervisor = make_supervisor(sidekick_spec, hooks, tmp_path, restart_backoff_s=0.1)
    run = asyncio.create_task(supervisor.run())
    await wait_event(hooks.events["ready"])
    first = supervisor.engine
    members = first.members()
    await asyncio.sleep(WATCH_SETTLE_S)  # the scenario: a failure once it serves, not a helper
    killed_at = time.monotonic()
    os.kill(first.pid, signal.SIGKILL)
    await async_eventually(lambda: supervisor.engine is not first, timeout=30, what="restart")
    restarted_s = time.monotonic() - killed_at
    assert not [pid for pid in members if pid_alive(pid)]  # the SIGTERM-deaf one too
    print(f"\nrest of the dead engine's group gone, restart begun {restarted_s:.2f} s after kill")
    assert restarted_s < 5.0
    await wait_for_call(hooks, "ready", 2)
    supervisor.request_stop()
    await asyncio.wait_for(run, 60)


async def test_a_crash_loop_gives_up_and_says_why(spec, tmp_path, redis_client):
    launches = tmp_path / "launches"
    # The first launch serves; every later one exits at once with code 3.
    body = f'echo x >> "{launches}"\n[ "$(wc -l < "{launches}")" -gt 1 ] && exit 3'
    hooks = Recorder()
    supervisor = make_supervisor(
        with_sidekick(spec, tmp_path, body), hooks, tmp_path,
        max_restarts=2, restart_backoff_s=0.1,
    )  # fmt: skip
    run = asyncio.create_task(supervisor.run())
    await wait_event(hooks.events["ready"])
    os.kill(supervisor.engine.pid, signal.SIGKILL)
    with pytest.raises(EngineExitedError) as excinfo:
        await asyncio.wait_for(run, 30)
    message = str(excinfo.value)
    assert "failed 3 times within 600 s; giving up (at most 2 restarts)" in message
    assert "exited with code 3 before it was healthy" in message
    assert hooks.calls == ["starting", "ready", "unhealthy", "gone"]
    assert launches.read_text().count("x") == 3
    assert heartbeat(redis_client) is None


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


async def test_stop_while_starting_never_marks_it_ready(spec, tmp_path, redis_client):
    script = tmp_path / "slow-python"
    script.write_text("#!/bin/sh\nexec sleep 60\n")
    script.chmod(0o755)
    hooks = Recorder()
    slow = dataclasses.replace(spec, python=str(script))
    supervisor = make_supervisor(slow, hooks, tmp_path, stop_timeout_s=5.0)
    run = asyncio.create_task(supervisor.run())
    beat = await async_eventually(lambda: heartbeat(redis_client), timeout=10, what="heartbeat")
    assert beat["state"] == "starting"
    supervisor.request_stop()
    await asyncio.wait_for(run, 15)
    assert hooks.calls == ["starting", "gone"]
    assert not pid_alive(supervisor.engine.pid)
    assert heartbeat(redis_client) is None


async def test_a_lora_engine_lists_its_resident_adapters_in_its_heartbeat(
    spec, tmp_path, redis_client
):
    """Whoever loads an adapter (a router, another router), the worker's heartbeat says so."""
    spec = dataclasses.replace(spec, max_loras=2)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    hooks = Recorder()
    supervisor = make_supervisor(spec, hooks, tmp_path, grace_s=1.0)
    run = asyncio.create_task(supervisor.run())
    try:
        await wait_event(hooks.events["ready"])
        assert heartbeat(redis_client)["adapters"] == []
        body = {"lora_name": "support@v1", "lora_path": str(adapter)}
        url = f"{spec.base_url}/v1/load_lora_adapter"
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
            assert resp.status == 200
        await async_eventually(
            lambda: (heartbeat(redis_client) or {}).get("adapters") == ["support@v1"],
            timeout=10, what="the adapter in the heartbeat",
        )  # fmt: skip
    finally:
        supervisor.request_stop()
        await asyncio.wait_for(run, 30)
