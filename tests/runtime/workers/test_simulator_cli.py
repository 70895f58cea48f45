"""``python -m runtime.workers.simulator`` as a real process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
from fixtures.net import free_port, port_accepts
from fixtures.wait import async_eventually, eventually

ROOT = Path(__file__).resolve().parents[3]
MODULE = "runtime.workers.simulator"

pytestmark = pytest.mark.integration


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", MODULE, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_help_says_it_is_a_simulator_without_gpus():
    result = run_cli("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "SIMULATOR for tests and benchmarks on machines without GPUs" in text
    assert "never a production backend" in text
    flags = ["--prefill-tps", "--decode-a-ms", "--decode-b-ms", "--max-num-seqs", "--seed",
             "--kv-capacity-tokens", "--max-model-len", "--fail-after-tokens"]  # fmt: skip
    assert [flag for flag in flags if flag not in text] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "m", "--kv-capacity-tokens", "1000"], "kv_capacity_tokens"),
        (["--model", "m", "--max-num-seqs", "0"], "max_num_seqs"),
        (["--model", "m", "--prefill-tps", "0"], "prefill_tps"),
        ([], "--model"),
    ],
)
def test_invalid_parameters_exit_with_usage_error(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.fixture
def simulator_process():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, "--port", str(port), "--model", "cli-model",
         "--max-num-seqs", "1", "--decode-a-ms", "5", "--max-model-len", "2048"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: proc.poll() is not None or port_accepts(port), timeout=30)
        assert proc.poll() is None
    except AssertionError:
        proc.kill()
        pytest.fail(f"simulator did not start: {proc.communicate()[0]}")
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


@pytest.mark.asyncio
async def test_process_serves_the_api_drops_waiting_clients_and_stops_on_sigterm(
    simulator_process,
):
    proc, url = simulator_process
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        result = await client.chat.completions.create(
            model="cli-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert result.usage.completion_tokens == 3
    async with aiohttp.ClientSession() as session:
        body = {"model": "cli-model", "prompt": "x", "max_tokens": 2000}
        running = asyncio.create_task(session.post(f"{url}/v1/completions", json=body))
        waiting = asyncio.create_task(session.post(f"{url}/v1/completions", json=body))

        async def metrics_text() -> str:
            async with session.get(f"{url}/metrics") as resp:
                return await resp.text()

        async def waiting_is(count: int) -> str | None:
            text = await metrics_text()
            return text if metric(text, "vllm:num_requests_waiting") == count else None

        metrics = await async_eventually(lambda: waiting_is(1), timeout=5, what="1 waiting")
        assert metric(metrics, "vllm:num_requests_running") == 1
        assert 'model_name="cli-model"' in metrics
        running.cancel()
        waiting.cancel()  # both clients hang up: the process must notice without writing

        async def idle() -> str | None:
            text = await metrics_text()
            running = metric(text, "vllm:num_requests_running")
            return text if running == 0 == metric(text, "vllm:num_requests_waiting") else None

        metrics = await async_eventually(idle, timeout=5, what="no request running or waiting")
        assert metric(metrics, "vllm:num_requests_running") == 0
        assert metric(metrics, "vllm:num_requests_waiting") == 0
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=20)[0]
    assert proc.returncode == 0
    assert "not a production backend" in output
