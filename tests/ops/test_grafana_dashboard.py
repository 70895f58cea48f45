"""platform/grafana: the dashboard parses, its queries are valid PromQL, and it names only
metrics the router exports and recording rules platform/prometheus defines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from exported_metrics import exported_metric_names

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "platform" / "grafana").glob("*.json"))
RULES = ROOT / "platform" / "prometheus" / "rules.yml"
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$class": ".*", "$model": ".*"}


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    found += [
        variable["query"]
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    return found


def recorded_rules() -> set[str]:
    document = yaml.safe_load(RULES.read_text())
    return {
        rule["record"]
        for group in document["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


@pytest.fixture(params=DASHBOARDS, ids=lambda path: path.name)
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(Path(request.param).read_text())
    return loaded


def test_there_is_a_dashboard() -> None:
    assert DASHBOARDS


def test_panels_are_well_formed(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = {panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"}
    assert {"Fleet", "Latency by stage", "Tenants", "Rollouts"} <= titles
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["gridPos"]["w"] <= 24


def test_names_only_exported_metrics_and_defined_rules(dashboard: dict[str, Any]) -> None:
    text = "\n".join(queries(dashboard))
    metrics = set(re.findall(r"\bswitchyard_[a-z0-9_]+", text))
    rules = set(re.findall(r"\bswitchyard:[a-z0-9_:]+", text))
    assert metrics
    assert metrics - exported_metric_names() == set()
    assert rules - recorded_rules() == set()


def test_queries_are_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: platform/install installs Debian's prometheus package")
    rules = []
    for number, query in enumerate(queries(dashboard)):
        if query.startswith("label_values("):
            continue
        expr = query
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{number}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
