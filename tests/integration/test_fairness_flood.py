"""A tenant flooding at 10x its rate: VTC keeps the others' TTFT, FCFS does not.

One router, two pools with the same simulator (16 sequences at a time, ~100 ms per engine
step, so time to first token is about one to two steps and grows with queueing): pool ``vtc``
(``{"fairness": "vtc"}``) and pool ``fcfs`` (``{"fairness": "fcfs"}``) — the policies chosen
by name, as the benchmark does. Both pools use the ``inflight_only`` saturation detector: the
simulator reports a request as waiting until its next engine step (vLLM V1 only once it is
scheduled), which with ``vllm_metrics`` holds dispatch for up to a scrape interval and makes
the p95 swing from run to run; with one router the in-flight count is exact anyway.

Three tenants send the same open-loop (Poisson, fixed seed)
streams of small chat requests to both pools at once: a baseline phase where all three send
``RATE`` requests per second, then a flood phase where one of them sends ten times that. The
two light tenants' TTFT p95 must stay within 20% of its baseline on the VTC pool, and must
not on the FCFS pool (there they wait behind the flood, or are refused). A run whose VTC figure
misses the bound is measured once more (CI's two cores are shared with the rest of the suite's
processes; the FCFS contrast is 10-20x, the VTC bound 1.2x) and the second run decides.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from fixtures.router import World, routers, start_simulator
from integration_support import (
    OpenLoop,
    add_class,
    p95,
    set_policies,
    tenant_limits,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timing,  # statistical: TTFT p95 under an open-loop flood (report in failures)
    pytest.mark.asyncio,
    pytest.mark.timeout(300),  # two runs of ~40 s at most, on a loaded machine
]

POLICIES = ("vtc", "fcfs")
LIGHT = ("light-1", "light-2")
FLOODER = "flooder"
RATE = 4.0  # requests per second per tenant and pool
FLOOD = 10.0  # the flooder's factor in the flood phase
WARMUP_S, BASELINE_S, FLOOD_S = 2.0, 16.0, 16.0
MAX_TOKENS = 4
SIM_ARGS = ("--max-num-seqs", "16", "--decode-a-ms", "100", "--decode-b-ms", "0.5",
            "--prefill-tps", "50000")  # fmt: skip


def model(policy: str) -> str:
    return f"flood-{policy}"


async def _measure(tmp_path: Path) -> tuple[dict[tuple[str, str], float], str]:
    """One run: the light tenants' TTFT p95 per (policy, phase) (and how many of the flooder's
    requests VTC served), and a report line."""
    sims = {policy: start_simulator(model(policy), *SIM_ARGS) for policy in POLICIES}
    try:
        world = World()
        add_class(world, "standard", band=0, deadline_ms=4000, max_queue=200)
        for index, policy in enumerate(POLICIES, start=1):
            world.add_model(model(policy), index)
            world.add_endpoint(index, index, sims[policy].base_url, pool=policy, capacity=16)
            set_policies(world, policy, fairness=policy, saturation="inflight_only")
        for tenant in (*LIGHT, FLOODER):
            world.add_tenant(tenant, classes=("standard",), default_class="standard",
                             tenant_limits=tenant_limits())  # fmt: skip
            world.add_key(tenant, tenant)
        with routers(world, tmp_path) as ([router], _):
            load = OpenLoop(router.base_url, dict(world.secrets), max_tokens=MAX_TOKENS)
            steady = [(t, model(p), RATE) for t in (*LIGHT, FLOODER) for p in POLICIES]
            flood = [(t, model(p), RATE) for t in LIGHT for p in POLICIES]
            flood += [(FLOODER, model(p), RATE * FLOOD) for p in POLICIES]
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=30)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
                await load.run(http, "warmup", WARMUP_S, steady)
                await load.run(http, "baseline", BASELINE_S, steady)
                await load.run(http, "flood", FLOOD_S, flood)
                await load.drain(timeout_s=15)
    finally:
        for sim in sims.values():
            sim.stop()

    figures: dict[tuple[str, str], float] = {}
    for policy in POLICIES:
        for phase in ("baseline", "flood"):
            ttfts = [
                o.ttft_s
                for o in load.outcomes
                if o.phase == phase and o.model == model(policy) and o.tenant in LIGHT
            ]
            assert len(ttfts) >= 30, (policy, phase, len(ttfts))
            figures[policy, phase] = p95(ttfts)
    flooder = {
        policy: sum(1 for o in load.outcomes if o.phase == "flood" and o.tenant == FLOODER
                    and o.model == model(policy) and o.status == 200)
        for policy in POLICIES
    }  # fmt: skip
    refused = {
        policy: Counter(o.status for o in load.outcomes if o.phase == "flood"
                        and o.tenant in LIGHT and o.model == model(policy) and o.status != 200)
        for policy in POLICIES
    }  # fmt: skip
    report = ", ".join(
        f"{p}: baseline {figures[p, 'baseline'] * 1000:.0f} ms, "
        f"flood {figures[p, 'flood'] * 1000:.0f} ms (light refused {dict(refused[p])}, "
        f"flooder served {flooder[p]})"
        for p in POLICIES
    )
    print(f"\nlight tenants' TTFT p95 — {report}")  # the measurement is the point
    figures["vtc", "flooder_served"] = float(flooder["vtc"])
    return figures, report


def _vtc_holds(figures: dict[tuple[str, str], float]) -> bool:
    return figures["vtc", "flood"] <= 1.2 * figures["vtc", "baseline"]


@pytest.fixture
def run_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A directory for each run's router."""
    dirs = (tmp_path / "first", tmp_path / "second")
    for directory in dirs:
        directory.mkdir()
    return dirs


async def test_vtc_keeps_light_tenants_ttft_under_a_flood_and_fcfs_does_not(
    run_dirs: tuple[Path, Path],
) -> None:
    figures, report = await _measure(run_dirs[0])
    if not _vtc_holds(figures):  # a second run when the shared box's noise moved the p95
        figures, again = await _measure(run_dirs[1])
        report = f"first run: {report}; second run: {again}"
    assert math.isfinite(figures["vtc", "baseline"]), report
    assert _vtc_holds(figures), report
    assert figures["fcfs", "flood"] > 1.2 * figures["fcfs", "baseline"], report
    assert figures["vtc", "flooder_served"] > 0, report  # the flooder is throttled, not starved
