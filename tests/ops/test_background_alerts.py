"""platform/prometheus/control_plane.yml: promtool checks the background-work alerts, each is
tested firing and quiet (tests/background_test.yml), and they name only metrics the control
plane's /metrics exports (config/ops_metrics.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry
from test_prometheus_rules import promtool

from config.ops_metrics import BatchSignals, OutboxSignals, RedisSignals, families

pytestmark = pytest.mark.unit

PROM = Path(__file__).resolve().parents[2] / "platform" / "prometheus"
RULES = PROM / "control_plane.yml"
TESTS = PROM / "tests" / "background_test.yml"


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", TESTS.name],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TESTS.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_once_and_stays_quiet_once() -> None:
    document = yaml.safe_load(RULES.read_text())
    expected = {r["alert"] for g in document["groups"] for r in g["rules"] if "alert" in r}
    assert {"SwitchyardBeatSilent", "SwitchyardLedgerLag", "SwitchyardCreditDrift",
            "SwitchyardSnapshotOutboxStuck"} <= expected  # fmt: skip
    expected.add("SwitchyardRouterRedisFallback")  # rules.yml's, tested in the same file
    fires, quiet = set(), set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert expected - fires == set()
    assert expected - quiet == set()


class _Sample(Collector):
    def collect(self):  # type: ignore[no-untyped-def]
        redis_part = RedisSignals(1.0, 2, 3.0, 4.0, 5, 6.0)
        batches = BatchSignals(lines=[("acme", "m", "pending", 1)], at_risk=0)
        return families(redis_part, OutboxSignals(pending=1, oldest_age_s=2.0), batches)


def test_rules_name_only_metrics_the_control_plane_exports() -> None:
    registry = CollectorRegistry()
    registry.register(_Sample())
    text = generate_latest(registry).decode()
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    named = set(re.findall(r"\bswitchyard_[a-z0-9_]+", RULES.read_text()))
    assert named
    assert named - exported == set()
