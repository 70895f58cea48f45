"""platform/grafana/control-plane/: the control plane's dashboard parses, its queries are valid
PromQL, and it names only metrics the control plane's /metrics exports (config/ops_metrics.py).
(It sits in its own folder: tests/ops/test_grafana_dashboard.py holds the top-level dashboards
to the router's metrics.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from test_background_alerts import _Sample
from test_prometheus_rules import promtool

pytestmark = pytest.mark.unit

DASHBOARD = (
    Path(__file__).resolve().parents[2]
    / "platform" / "grafana" / "control-plane" / "switchyard-control-plane.json"
)  # fmt: skip


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def test_panels_are_well_formed() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert {"Background work", "Ledger"} <= {p["title"] for p in panels if p["type"] == "row"}
    for panel in panels:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]


def test_names_only_metrics_the_control_plane_exports() -> None:
    registry = CollectorRegistry()
    registry.register(_Sample())
    text = generate_latest(registry).decode()
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    named = set(re.findall(r"\bswitchyard_[a-z0-9_]+", "\n".join(queries())))
    assert {"switchyard_beat_heartbeat_age_seconds", "switchyard_usage_backlog_events"} <= named
    assert named - exported == set()


def test_queries_are_valid_promql(tmp_path: Path) -> None:
    rules = [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries())]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool(), "check", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
