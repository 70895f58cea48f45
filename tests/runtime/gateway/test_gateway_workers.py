"""``python -m runtime.gateway --workers 2``: both workers serve one port, and ``/metrics``
(answered by either worker) counts the requests of both (prometheus_client multiprocess)."""

from __future__ import annotations

import os
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fixtures.router import (
    Publisher,
    World,
    http_get,
    redis_url,
    spawn,
    wait_ready,
    wait_until_up,
)
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from runtime.gateway.__main__ import prepare_multiprocess_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REQUESTS = 60
ROUNDS = 200  # bounded by BOTH_SERVE_WITHIN_S first
BOTH_SERVE_WITHIN_S = 60.0
CONCURRENCY = 16
METRIC = "switchyard_requests_total"


def _refused(base_url: str) -> int:
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        data=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
        headers={"Authorization": "Bearer sy_nobody_" + "x" * 40,
                 "Content-Type": "application/json", "Connection": "close"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _total(text: str) -> float:
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith(METRIC + "{") and 'outcome="invalid_api_key"' in line
    )


def _per_worker(directory: Path) -> Counter[str]:
    """Requests counted by each worker, read from its own file alone."""
    counts: Counter[str] = Counter()
    for path in directory.glob("counter_*.db"):
        with tempfile.TemporaryDirectory() as alone:
            (Path(alone) / path.name).write_bytes(path.read_bytes())
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=alone)
            for metric in registry.collect():
                for sample in metric.samples:
                    if sample.name == METRIC and sample.labels.get("outcome") == "invalid_api_key":
                        counts[path.name] += int(sample.value)
    return counts


def test_two_workers_serve_and_metrics_add_up_both(tmp_path: Path) -> None:
    publisher = Publisher(f"switchyard:test:workers:{uuid.uuid4().hex[:10]}")
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999.db").write_bytes(b"stale")  # a previous run's leftover
    env = {
        **os.environ,
        "REDIS_URL": redis_url(),
        "SWITCHYARD_SNAPSHOT_PREFIX": publisher.prefix,
        "SWITCHYARD_VAR_DIR": str(tmp_path / "var"),
        "SWITCHYARD_KEY_USAGE_HASH": f"{publisher.prefix}:apikey:last_used",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    router = None
    try:
        version = publisher.publish(World().snapshot())
        process, _ = spawn(["runtime.gateway", "--workers", "2", "--log-level", "warning"],
                           env=env)  # fmt: skip
        router = wait_until_up(process, "/healthz")
        wait_ready(router, version)
        assert not (metrics_dir / "counter_999999.db").exists()  # cleaned at start
        # Concurrent requests, in bounded rounds, until both workers have served some (the
        # kernel hands each connection to whichever worker accepts first).
        # The second worker may still be starting when the first answers /healthz (on a busy
        # machine): rounds go on until both served, within a time bound.
        sent = 0
        per_worker: Counter[str] = Counter()
        deadline = time.monotonic() + BOTH_SERVE_WITHIN_S
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            for _ in range(ROUNDS):
                statuses = Counter(pool.map(_refused, [router.base_url] * REQUESTS))
                assert statuses == {401: REQUESTS}
                sent += REQUESTS
                per_worker = _per_worker(metrics_dir)
                if len(per_worker) == 2 or time.monotonic() > deadline:
                    break
        assert len(per_worker) == 2, f"one worker served everything: {per_worker}"
        assert sum(per_worker.values()) == sent
        # Every scrape, whichever worker answers it, sees both workers' requests.
        for _ in range(6):
            status, body = http_get(f"{router.base_url}/metrics")
            assert status == 200
            assert _total(body.decode()) == sent
    finally:
        if router is not None:
            router.stop()
        publisher.cleanup()


@pytest.mark.unit
def test_one_worker_without_a_directory_keeps_single_process_metrics(tmp_path: Path) -> None:
    env = {"SWITCHYARD_VAR_DIR": str(tmp_path)}
    assert prepare_multiprocess_metrics(1, 8080, env) is None
    assert "PROMETHEUS_MULTIPROC_DIR" not in env
    directory = prepare_multiprocess_metrics(2, 8080, env)
    assert directory == tmp_path / "prometheus-8080"
    assert directory.is_dir()
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(directory.resolve())
