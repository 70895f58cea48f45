"""Supervisor start-up: artifact verification, the engine command line, start failures.

A digest mismatch must refuse before anything is registered or launched: the "python" the
spec would run is a script that leaves a marker file, and the hooks record every call.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import sys
from pathlib import Path

import pytest
from fixtures.net import free_port

from runtime.artifacts import compute_manifest
from runtime.workers.launch import OFFLINE_ENV, WorkerSpec, build_command, build_env
from runtime.workers.supervisor import (
    ArtifactRefusedError,
    Supervisor,
    SupervisorSettings,
    WorkerStartError,
)

pytestmark = pytest.mark.integration


class Recorder:
    """Hooks that record what the supervisor told the control plane."""

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


def fake_python(tmp_path: Path, body: str) -> Path:
    """An executable standing in for the engine's interpreter."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture
def demo_copy(demo_model_artifact, tmp_path):
    """A private copy of the session's generated demo model, free to tamper with."""
    target = tmp_path / "demo-llama"
    shutil.copytree(demo_model_artifact.path, target)
    return target


def demo_spec(artifact, path: Path, **overrides) -> WorkerSpec:
    values = {
        "artifact_dir": path,
        "expected_digest": artifact.digest,
        "expected_files": artifact.files,
        "served_model_name": "demo-llama",
        "port": free_port(),
        **overrides,
    }
    return WorkerSpec(**values)


# --- digest verification --------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.asyncio
async def test_tampered_artifact_refuses_to_start_and_launches_nothing(
    demo_model_artifact, demo_copy, tmp_path
):
    marker = tmp_path / "launched"
    python = fake_python(tmp_path, f'touch "{marker}"; exec sleep 30')
    with (demo_copy / "config.json").open("a") as fh:
        fh.write(" ")  # one byte more: a different sha256
    hooks = Recorder()
    spec = demo_spec(demo_model_artifact, demo_copy, python=str(python))

    with pytest.raises(ArtifactRefusedError) as excinfo:
        await Supervisor(spec, hooks=hooks).run()

    message = str(excinfo.value)
    assert message.startswith("refusing to serve demo-llama: ")
    assert f"the artifact in {demo_copy} does not match the registry" in message
    assert f"expected {demo_model_artifact.digest}" in message
    assert message.endswith("differing files: config.json")
    assert hooks.calls == []  # no endpoint registered
    assert not marker.exists()  # no engine launched (run() launches it before it returns)


@pytest.mark.unit
@pytest.mark.asyncio
async def test_added_and_removed_files_are_named(demo_model_artifact, demo_copy):
    (demo_copy / "extra.bin").write_bytes(b"\0")
    (demo_copy / "tokenizer.json").unlink()
    with pytest.raises(
        ArtifactRefusedError, match=r"differing files: extra\.bin, tokenizer\.json$"
    ):
        await Supervisor(demo_spec(demo_model_artifact, demo_copy)).run()


@pytest.mark.unit
@pytest.mark.asyncio
async def test_mismatch_without_a_file_list_still_names_both_digests(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"weights")
    actual, _ = compute_manifest(tmp_path)
    spec = WorkerSpec(
        artifact_dir=tmp_path, expected_digest="0" * 64, served_model_name="m", port=free_port()
    )
    with pytest.raises(ArtifactRefusedError) as excinfo:
        await Supervisor(spec).run()
    assert f"artifact digest {actual} does not match expected {'0' * 64}" in str(excinfo.value)


@pytest.mark.unit
@pytest.mark.asyncio
async def test_missing_artifact_folder_is_refused(tmp_path):
    spec = WorkerSpec(
        artifact_dir=tmp_path / "nowhere",
        expected_digest="0" * 64,
        served_model_name="m",
        port=free_port(),
    )
    hooks = Recorder()
    with pytest.raises(
        ArtifactRefusedError, match=r"refusing to serve m: .*nowhere does not exist"
    ):
        await Supervisor(spec, hooks=hooks).run()
    assert hooks.calls == []


# --- the engine command line ----------------------------------------------------------------


def _spec(**overrides) -> WorkerSpec:
    values = {
        "artifact_dir": Path("/models/demo"),
        "expected_digest": "a" * 64,
        "served_model_name": "demo-llama",
        "port": 8101,
        **overrides,
    }
    return WorkerSpec(**values)


@pytest.mark.unit
def test_cpu_command_line_is_vllm_cpus_openai_server_in_eager_float32():
    argv = build_command(_spec(max_num_seqs=8))
    assert argv == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/models/demo", "--served-model-name", "demo-llama",
        "--host", "127.0.0.1", "--port", "8101", "--max-model-len", "2048",
        "--max-num-seqs", "8", "--scheduling-policy", "priority",
        "--dtype", "float32", "--enforce-eager",
    ]  # fmt: skip


@pytest.mark.unit
def test_gpu_command_line_uses_the_checkpoint_dtype_and_tensor_parallelism():
    argv = build_command(
        _spec(device="gpu", tensor_parallel_size=4, extra_args=("--gpu-memory-utilization", "0.8"))
    )
    assert argv[-8:] == [
        "--scheduling-policy", "priority", "--dtype", "auto", "--tensor-parallel-size", "4",
        "--gpu-memory-utilization", "0.8",
    ]  # fmt: skip
    assert "--enforce-eager" not in argv


@pytest.mark.unit
def test_simulator_command_line():
    argv = build_command(_spec(backend="simulator", max_model_len=4096))
    assert argv == [
        sys.executable, "-m", "runtime.workers.simulator", "--model", "demo-llama",
        "--host", "127.0.0.1", "--port", "8101", "--max-model-len", "4096",
    ]  # fmt: skip


@pytest.mark.unit
def test_kv_events_turn_on_prefix_caching_and_a_zmq_publisher():
    vllm = build_command(_spec(kv_events_port=5557))
    at = vllm.index("--kv-events-config")
    assert vllm[at - 1] == "--enable-prefix-caching"
    # vLLM binds only a wildcard address (it connects to any other): every interface.
    assert json.loads(vllm[at + 1]) == {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
    }  # fmt: skip
    simulator = build_command(_spec(backend="simulator", kv_events_port=5557))
    assert simulator[-2:] == ["--kv-events-endpoint", "tcp://127.0.0.1:5557"]
    assert "--kv-events-config" not in build_command(_spec())
    assert _spec(host="::1", kv_events_port=9).kv_events_bind == "tcp://[::1]:9"


@pytest.mark.unit
def test_engine_environment_is_offline_and_spec_env_wins():
    env = build_env(_spec(env={"VLLM_CPU_OMP_THREADS_BIND": "auto"}), base={"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        **OFFLINE_ENV,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "auto",
    }
    gpu = build_env(_spec(device="gpu"), base={"HF_HUB_OFFLINE": "0"})
    assert gpu == dict(OFFLINE_ENV)


@pytest.mark.unit
def test_wildcard_host_is_probed_on_loopback():
    assert _spec(host="0.0.0.0").base_url == "http://127.0.0.1:8101"
    assert _spec(host="::1").base_url == "http://[::1]:8101"


# --- start failures -------------------------------------------------------------------------


@pytest.fixture
def tiny_artifact(tmp_path):
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"weights")
    digest, files = compute_manifest(folder)
    return folder, digest, files


def sim_spec(tiny_artifact, **overrides) -> WorkerSpec:
    folder, digest, files = tiny_artifact
    values = {
        "artifact_dir": folder,
        "expected_digest": digest,
        "expected_files": files,
        "served_model_name": "sim",
        "port": free_port(),
        "backend": "simulator",
        **overrides,
    }
    return WorkerSpec(**values)


def quiet(tmp_path: Path, **overrides) -> SupervisorSettings:
    values = {"engine_log": tmp_path / "engine.log", "handle_signals": False, **overrides}
    return SupervisorSettings(**values)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_port_in_use_refuses_before_registering(tiny_artifact, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        hooks = Recorder()
        with pytest.raises(WorkerStartError, match=f"cannot serve on 127.0.0.1:{port}: "):
            await Supervisor(
                sim_spec(tiny_artifact, port=port), hooks=hooks, settings=quiet(tmp_path)
            ).run()
    assert hooks.calls == []


@pytest.mark.integration
@pytest.mark.asyncio
async def test_engine_exiting_at_start_fails_with_its_last_output(tiny_artifact, tmp_path):
    hooks = Recorder()
    spec = sim_spec(tiny_artifact, extra_args=("--max-num-seqs", "0"))
    with pytest.raises(WorkerStartError) as excinfo:
        await Supervisor(spec, hooks=hooks, settings=quiet(tmp_path)).run()
    message = str(excinfo.value)
    assert message.startswith("sim did not start: the engine exited with code 2 before it was")
    assert "Last lines of the engine's output:" in message
    assert "max_num_seqs" in message  # the simulator's own complaint
    assert hooks.calls == ["starting", "gone"]


@pytest.mark.integration
@pytest.mark.asyncio
async def test_engine_never_healthy_times_out_and_is_killed(tiny_artifact, tmp_path):
    pid_file = tmp_path / "pid"
    python = fake_python(tmp_path, f'echo $$ > "{pid_file}"; echo loading forever; exec sleep 60')
    hooks = Recorder()
    spec = sim_spec(tiny_artifact, python=str(python))
    with pytest.raises(WorkerStartError) as excinfo:
        await Supervisor(
            spec, hooks=hooks, settings=quiet(tmp_path, start_timeout_s=1.0, stop_timeout_s=5.0)
        ).run()
    assert "the engine was not healthy within 1 s" in str(excinfo.value)
    assert "loading forever" in str(excinfo.value)
    assert hooks.calls == ["starting", "gone"]
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_failed_warmup_fails_the_start(tiny_artifact, tmp_path):
    hooks = Recorder()
    spec = sim_spec(tiny_artifact, extra_args=("--fail-after-tokens", "0"))
    with pytest.raises(WorkerStartError, match="sim did not start: the warmup completion failed"):
        await Supervisor(spec, hooks=hooks, settings=quiet(tmp_path)).run()
    assert hooks.calls == ["starting", "gone"]


@pytest.mark.integration
@pytest.mark.asyncio
async def test_missing_interpreter_is_a_start_error(tiny_artifact, tmp_path):
    hooks = Recorder()
    spec = sim_spec(tiny_artifact, python=str(tmp_path / "no-such-python"))
    with pytest.raises(WorkerStartError, match=r"cannot launch .*no-such-python"):
        await Supervisor(spec, hooks=hooks, settings=quiet(tmp_path)).run()
    assert hooks.calls == ["starting", "gone"]


@pytest.mark.integration
@pytest.mark.asyncio
async def test_unwritable_engine_log_is_refused_before_registering(tiny_artifact, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    hooks = Recorder()
    settings = quiet(tmp_path, engine_log=blocker / "engine.log")  # a folder that is a file
    with pytest.raises(WorkerStartError, match="cannot write the engine log"):
        await Supervisor(sim_spec(tiny_artifact), hooks=hooks, settings=settings).run()
    assert hooks.calls == []
