"""``manage.py plan_capacity`` on the example files, its errors, and --measure on a simulator."""

from __future__ import annotations

import json
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from runtime.procs import free_port, start_child

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DEMAND = REPO / "platform/capacity/example-demand.json"
CURVES = REPO / "platform/capacity/simulator-curves.json"


def run(*args: str) -> str:
    out = StringIO()
    call_command("plan_capacity", *args, stdout=out)
    return out.getvalue()


def test_plans_the_example_and_names_the_binding_constraint() -> None:
    text = run("--demand", str(DEMAND), "--curves", str(CURVES), "--zones", "3")
    assert "binding" in text
    assert "decode" in text
    plans = json.loads(run("--demand", str(DEMAND), "--curves", str(CURVES), "--zones", "3",
                           "--json"))  # fmt: skip
    (sim,) = plans
    assert sim["binding"] == "decode"
    assert sim["batch"] == 16
    # ceil(decode load / 0.8) replicas, then 3 zones * ceil(base / 2).
    assert sim["replicas"] == 3 * -(-sim["base"] // 2)


def test_errors_are_command_errors(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="--demand and --curves"):
        run()
    bad = tmp_path / "d.json"
    bad.write_text('{"rate_rps": 1}')
    with pytest.raises(CommandError, match="prompt_tokens"):
        run("--demand", str(bad), "--curves", str(CURVES))
    with pytest.raises(CommandError, match="headroom"):
        run("--demand", str(DEMAND), "--curves", str(CURVES), "--headroom", "1.5")
    with pytest.raises(CommandError, match="--model"):
        run("--measure", "http://127.0.0.1:9")


@pytest.mark.integration
def test_measure_a_simulator_curve(tmp_path: Path) -> None:
    port = free_port()
    sim = start_child(
        "sim",
        [sys.executable, "-m", "runtime.workers.simulator", "--model", "curve", "--port",
         str(port), "--prefill-tps", "4000", "--decode-a-ms", "10", "--log-level", "WARNING"],
        log=tmp_path / "sim.log", port=port, cwd=REPO,
    )  # fmt: skip
    try:
        sim.wait_http("/health", timeout_s=30)
        curve = json.loads(run("--measure", sim.base_url, "--model", "curve", "--batches", "1,8"))
    finally:
        sim.stop()
    p1, p8 = curve["tiers"]["sim"]["points"]
    assert 2000 < p1["prefill_tps"] < 6000  # the simulator's 4000 tokens/s, measured
    assert p8["decode_tps"] > 3 * p1["decode_tps"]  # batching pays: 8/(10+4 ms) vs 1/10.5 ms
