"""A real vLLM engine started by the worker supervisor serves the demo model.

All CPU tests here share the session's one engine (``vllm_demo_engine``, tests/fixtures/
vllm_engine.py). The demo model's weights are random: the text is junk, so the tests check the
protocol (shapes, token counts, finish reasons), not the words. The GPU test starts its own
engine with ``--device gpu`` and skips on machines without an NVIDIA GPU.
"""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from fixtures.vllm_engine import SupervisorThread, free_port

from runtime.workers.launch import WorkerSpec
from runtime.workers.probe import requests_in_flight
from runtime.workers.supervisor import SupervisorSettings

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(vllm_demo_engine):
    with openai.OpenAI(
        base_url=vllm_demo_engine.openai_base_url, api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


def test_lists_the_demo_model_under_its_served_name(client, vllm_demo_engine):
    models = client.models.list().data
    assert [model.id for model in models] == ["demo-llama"]
    assert models[0].model_extra["max_model_len"] == vllm_demo_engine.artifact.spec.max_context


def test_completion(client):
    result = client.completions.create(
        model="demo-llama", prompt="The switchyard", max_tokens=8, temperature=0.0
    )
    choice = result.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert 1 <= result.usage.completion_tokens <= 8
    assert result.usage.prompt_tokens > 0
    assert isinstance(choice.text, str)


def test_chat_completion_streams_with_usage(client):
    stream = client.chat.completions.create(
        model="demo-llama",
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=6,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("length", "stop")
    assert chunks[-1].usage is not None
    assert 1 <= chunks[-1].usage.completion_tokens <= 6


def test_priority_scheduling_is_on(client):
    """The supervisor starts vLLM with --scheduling-policy priority: requests may carry it."""
    for priority in (-10, 0, 10):
        result = client.completions.create(
            model="demo-llama", prompt="x", max_tokens=1, extra_body={"priority": priority}
        )
        assert result.usage.completion_tokens == 1


def test_drain_probe_reads_vllms_metrics(vllm_demo_engine):
    async def probe() -> int | None:
        async with aiohttp.ClientSession() as session:
            return await requests_in_flight(session, vllm_demo_engine.base_url)

    assert asyncio.run(probe()) == 0


@pytest.mark.gpu
def test_gpu_engine_serves_the_demo_model(demo_model_artifact, tmp_path):
    spec = WorkerSpec(
        artifact_dir=demo_model_artifact.path,
        expected_digest=demo_model_artifact.digest,
        expected_files=demo_model_artifact.files,
        served_model_name="demo-llama",
        port=free_port(),
        device="gpu",
        max_model_len=demo_model_artifact.spec.max_context,
        max_num_seqs=8,
        extra_args=("--gpu-memory-utilization", "0.3"),
    )
    runner = SupervisorThread(
        spec,
        SupervisorSettings(
            start_timeout_s=480.0,
            grace_s=0.0,
            handle_signals=False,
            engine_log=tmp_path / "vllm-gpu.log",
        ),
    )
    runner.start()
    try:
        runner.wait_ready(540.0)
        with openai.OpenAI(
            base_url=f"{spec.base_url}/v1", api_key="unused", max_retries=0
        ) as client:
            result = client.completions.create(
                model="demo-llama", prompt="Hello", max_tokens=4, temperature=0.0
            )
        assert 1 <= result.usage.completion_tokens <= 4
    finally:
        runner.stop()
