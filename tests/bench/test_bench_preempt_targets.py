"""The harness's preemption targets carry bench.preempt_sweep's arms as pool policies (#34)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scenario import load
from bench.targets import FACTORIES
from runtime.scheduling.settings import PoolSettings

pytestmark = pytest.mark.unit

CONTENTION = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "contention.toml"


@pytest.mark.parametrize(("name", "home"), [("switchyard-paced", False), ("switchyard-home", True)])
def test_the_paced_and_home_targets_set_the_sweeps_arms(name: str, home: bool) -> None:
    target = FACTORIES[name]()
    policies = target.policies(load(CONTENTION))  # type: ignore[attr-defined]
    settings = PoolSettings.from_policies(policies, [])
    assert settings.preemption == "fair"
    assert settings.lend_reserve == 3
    assert settings.pace_prefill_tps == 2500.0
    assert settings.resume_first is True
    assert settings.resume_affinity is home
