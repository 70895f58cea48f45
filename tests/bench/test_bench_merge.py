"""Simultaneous runs of one schedule join into one report; anything else is refused."""

from __future__ import annotations

from typing import Any

import pytest

from bench.merge import MergeError, merge

pytestmark = pytest.mark.unit


def _run(targets: list[str], *, start: float = 100.0, seed: int = 7, size: str = "full") -> dict:
    figures: dict[str, Any] = {t: {"ok": 10} for t in targets}
    return {
        "scenario_doc": {"name": "prefix"},
        "size": size,
        "seed": seed,
        "command": ["python", "-m", "bench", "run", "--targets", ",".join(targets)],
        "started_at": start,
        "finished_at": start + 300.0,
        "machine": {"router_cpus": [len(targets)]},
        "targets": {t: {"status": "ran"} for t in targets},
        "phases": {"load-8": {"offered_rps": 8.0, "targets": dict(figures)}},
    }


def test_simultaneous_runs_join_their_targets_phase_by_phase() -> None:
    joined = merge([("a", _run(["switchyard-load-only"])), ("b", _run(["switchyard"], start=110))])
    assert set(joined["targets"]) == {"switchyard-load-only", "switchyard"}
    assert set(joined["phases"]["load-8"]["targets"]) == {"switchyard-load-only", "switchyard"}
    assert joined["phases"]["load-8"]["offered_rps"] == 8.0
    assert [m["report"] for m in joined["merged_from"]] == ["a", "b"]
    assert joined["started_at"] == 100.0
    assert joined["finished_at"] == 410.0


@pytest.mark.parametrize(
    ("other", "reason"),
    [
        (_run(["switchyard"], seed=8), "seed differs"),
        (_run(["switchyard"], size="medium"), "size differs"),
        (_run(["switchyard"], start=1000.0), "same time"),
        (_run(["switchyard-load-only"]), "in another report too"),
    ],
)
def test_runs_that_are_not_one_schedule_at_one_time_are_refused(other: dict, reason: str) -> None:
    with pytest.raises(MergeError, match=reason):
        merge([("a", _run(["switchyard-load-only"])), ("b", other)])


def test_one_report_is_not_a_merge() -> None:
    with pytest.raises(MergeError, match="two reports"):
        merge([("a", _run(["switchyard"]))])
