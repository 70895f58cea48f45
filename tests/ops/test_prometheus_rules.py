"""platform/prometheus: promtool checks and unit-tests the rules; each alert is tested both ways;
rules name only metrics the router exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from exported_metrics import exported_metric_names

pytestmark = pytest.mark.unit

PROM = Path(__file__).resolve().parents[2] / "platform" / "prometheus"
RULES = PROM / "rules.yml"
UNIT_TESTS = sorted((PROM / "tests").glob("*_test.yml"))


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: platform/install installs Debian's prometheus package")
    return found


def alerts() -> set[str]:
    document = yaml.safe_load(RULES.read_text())
    return {
        rule["alert"] for group in document["groups"] for rule in group["rules"] if "alert" in rule
    }


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    assert UNIT_TESTS
    result = subprocess.run(
        [promtool(), "test", "rules", *map(str, UNIT_TESTS)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROM / "tests",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_test() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    expected = alerts()
    assert {"SwitchyardSLOFastBurn", "SwitchyardSLOSlowBurn", "SwitchyardSnapshotStale"} <= expected
    assert expected - fires == set(), "alerts without a test where they fire"
    assert expected - quiet == set(), "alerts without a test where they stay quiet"


def test_rules_name_only_metrics_the_router_exports() -> None:
    exported = exported_metric_names()
    named = set(re.findall(r"\bswitchyard_[a-z0-9_]+", RULES.read_text()))
    assert named
    assert named - exported == set()
