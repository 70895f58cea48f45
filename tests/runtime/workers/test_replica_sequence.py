"""The one start-up sequence every worker shares (runtime/workers/replica.py), with a plain
engine in place of vLLM or the encoder: the order of the hooks, refusals before registering,
gone after any failure once registered, the drain's second stop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fixtures.wait import async_eventually

from runtime.procs import free_port
from runtime.workers.replica import (
    ArtifactRefusedError,
    ReplicaLife,
    ReplicaSpec,
    WorkerStartError,
)

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


class Hooks:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_starting(self, base_url: str) -> int | None:
        self.calls.append("starting")
        return None

    async def on_ready(self) -> None:
        self.calls.append("ready")

    async def on_draining(self) -> None:
        self.calls.append("draining")

    async def on_unhealthy(self, reason: str) -> None:
        self.calls.append("unhealthy")

    async def on_gone(self) -> None:
        self.calls.append("gone")


class Engine:
    """Ready at once, then waits for a stop and drains until a second stop (``force``)."""

    def __init__(self, hooks: Hooks, *, fail_prepare: bool = False, fail_serve: bool = False):
        self.hooks = hooks
        self.fail_prepare = fail_prepare
        self.fail_serve = fail_serve
        self.drained_by_force = False

    def prepare(self) -> None:
        self.hooks.calls.append("prepare")
        if self.fail_prepare:
            raise WorkerStartError("cannot write the log")

    async def serve(self, life: ReplicaLife) -> None:
        if self.fail_serve:
            raise WorkerStartError("the engine did not start")
        await life.ready()
        await life.wait_stop()
        await life.draining()
        await life.force.wait()
        self.drained_by_force = True

    async def close(self) -> None:
        self.hooks.calls.append("close")


def spec(tmp_path: Path) -> ReplicaSpec:
    port = free_port()
    return ReplicaSpec(
        name="m", host="127.0.0.1", port=port, base_url=f"http://127.0.0.1:{port}",
        artifact_dir=tmp_path, expected_digest=None, handle_signals=False,
    )  # fmt: skip


async def test_the_sequence_in_order_and_the_second_stop_ends_the_drain(tmp_path: Path) -> None:
    hooks = Hooks()
    engine = Engine(hooks)
    life = ReplicaLife(spec(tmp_path), hooks=hooks)
    run = asyncio.create_task(life.run(engine))
    await async_eventually(lambda: "ready" in hooks.calls, timeout=2.0, what="ready")
    life.request_stop()
    await async_eventually(lambda: "draining" in hooks.calls, timeout=2.0, what="draining")
    assert not run.done()  # draining until the second stop
    life.request_stop()
    await asyncio.wait_for(run, 5)
    assert engine.drained_by_force
    assert hooks.calls == ["prepare", "starting", "ready", "draining", "close", "gone"]


async def test_a_failed_prepare_refuses_before_registering(tmp_path: Path) -> None:
    hooks = Hooks()
    with pytest.raises(WorkerStartError, match="cannot write the log"):
        await ReplicaLife(spec(tmp_path), hooks=hooks).run(Engine(hooks, fail_prepare=True))
    assert hooks.calls == ["prepare"]


async def test_a_failed_start_after_registering_still_ends_gone(tmp_path: Path) -> None:
    hooks = Hooks()
    with pytest.raises(WorkerStartError, match="did not start"):
        await ReplicaLife(spec(tmp_path), hooks=hooks).run(Engine(hooks, fail_serve=True))
    assert hooks.calls == ["prepare", "starting", "close", "gone"]


async def test_a_mismatched_artifact_is_refused_before_anything(tmp_path: Path) -> None:
    hooks = Hooks()
    (tmp_path / "weights.bin").write_bytes(b"x")
    refused = ReplicaLife(
        ReplicaSpec(
            name="m", host="127.0.0.1", port=free_port(), base_url="http://127.0.0.1:1",
            artifact_dir=tmp_path, expected_digest="0" * 64, handle_signals=False,
        ),
        hooks=hooks,
    )  # fmt: skip
    with pytest.raises(ArtifactRefusedError, match="refusing to serve m"):
        await refused.run(Engine(hooks))
    assert hooks.calls == []


async def test_a_stop_before_run_serves_nothing(tmp_path: Path) -> None:
    hooks = Hooks()
    life = ReplicaLife(spec(tmp_path), hooks=hooks)
    life.request_stop()
    await life.run(Engine(hooks))
    assert hooks.calls == []
