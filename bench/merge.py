"""One report from runs of the same scenario made at the same time on disjoint cores.

``python -m bench merge A/report.json B/report.json ... --out DIR`` joins the targets of bench
runs that played the same schedule (same scenario document, size and seed; each run with its
own simulators, its router pinned to its own core) into one ``report.json`` with its
comparisons, goals and plots computed again over all of them, as if one run had held every
target. This is how a full-size scenario whose targets would take longer in turn than a lent
machine's call allows is measured in one sitting (``bench/device/multi.sh``, ``bench run
--no-direct``): the targets run side by side instead of one after another.

Refused, with the reason: runs of different scenario documents, sizes or seeds; runs that did
not overlap in time; a target in two runs; a phase missing from a run. The merged report names
its runs (``merged_from``: each one's path, command, start and end, machine placement), so a
reader can tell that its targets ran at the same time rather than in turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class MergeError(ValueError):
    """The reports cannot be one run's."""


def merge(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The reports' targets and phase figures in one report (comparisons not yet computed)."""
    if len(reports) < 2:
        raise MergeError("give two reports or more")
    first_name, first = reports[0]
    for name, other in reports[1:]:
        for key in ("scenario_doc", "size", "seed"):
            if other.get(key) != first.get(key):
                raise MergeError(f"{name}: its {key} differs from {first_name}'s")
        if not _overlap(first, other):
            raise MergeError(f"{name}: it did not run at the same time as {first_name}")
        if set(other.get("phases") or {}) != set(first.get("phases") or {}):
            raise MergeError(f"{name}: its phases differ from {first_name}'s")
    targets: dict[str, Any] = {}
    phases: dict[str, Any] = {
        phase: {**body, "targets": {}} for phase, body in (first.get("phases") or {}).items()
    }
    for name, report in reports:
        for target, info in (report.get("targets") or {}).items():
            if target in targets:
                raise MergeError(f"{name}: target {target!r} is in another report too")
            targets[target] = info
        for phase, body in report["phases"].items():
            phases[phase]["targets"].update(body.get("targets") or {})
    return {
        **first,
        "command": None,
        "started_at": min(r.get("started_at") or 0.0 for _, r in reports),
        "finished_at": max(r.get("finished_at") or 0.0 for _, r in reports),
        "merged_from": [
            {
                "report": name,
                "command": r.get("command"),
                "started_at": r.get("started_at"),
                "finished_at": r.get("finished_at"),
                "machine": r.get("machine"),
            }
            for name, r in reports
        ],
        "targets": targets,
        "phases": phases,
        "plots": [],
    }


def _overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    try:
        return bool(a["started_at"] < b["finished_at"] and b["started_at"] < a["finished_at"])
    except (KeyError, TypeError):
        return False


def load_all(paths: Sequence[Path]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(str(path), json.loads(path.read_text())) for path in paths]
