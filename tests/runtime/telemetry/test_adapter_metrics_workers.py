"""With several router workers, the LoRA adapter metrics are summed over the workers.

Each worker keeps its own residency book; a scrape-time view would answer with whichever worker
took the scrape (counters going up and down between scrapes, as seen under ``switchyard up``).
Two real worker processes copy their books into prometheus_client's per-process files; a third
process renders ``/metrics`` as any worker would and sees the sums (and the largest resident
count), and a second copy without new events adds nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]

WORKER = """
import sys
from runtime.telemetry.adapter_metrics import AdapterRow
from runtime.telemetry.metrics import RouterMetrics
loads = int(sys.argv[1])
rows = [AdapterRow(endpoint=7, loads=loads, evictions=1, waited=2, hits=5,
                   load_s_total=0.5 * loads, resident=loads, active=1)]
metrics = RouterMetrics()
metrics.attach_adapters(lambda: rows)
metrics.sync_adapters()
metrics.sync_adapters()  # nothing new: adds nothing
print("synced", flush=True)
sys.stdin.read()  # stay alive (live gauges) until the test closes stdin
"""

READER = """
from runtime.telemetry.metrics import RouterMetrics
metrics = RouterMetrics()
metrics.attach_adapters(lambda: [])
print(metrics.render()[0].decode())
"""


def test_every_worker_counts_and_any_worker_answers_the_sum(tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(REPO), "PATH": "/usr/bin"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(loads)],
            env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for loads in (3, 4)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "synced"
        out = subprocess.run([sys.executable, "-c", READER], env=env, cwd=REPO, text=True,
                             capture_output=True, timeout=60, check=True).stdout  # fmt: skip
    finally:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait(timeout=30)
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(out)
        for sample in family.samples
        if sample.name.startswith("switchyard_adapter_") and sample.labels.get("endpoint") == "7"
    }
    assert values["switchyard_adapter_loads_total"] == 7
    assert values["switchyard_adapter_evictions_total"] == 2
    assert values["switchyard_adapter_load_waits_total"] == 4
    assert values["switchyard_adapter_hits_total"] == 10
    assert values["switchyard_adapter_load_seconds_count"] == 7
    assert values["switchyard_adapter_load_seconds_sum"] == pytest.approx(3.5)
    assert values["switchyard_adapter_resident"] == 4
    assert values["switchyard_adapter_active"] == 1
