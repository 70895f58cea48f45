"""What the rollouts page shows of each rollout, as plain dicts (page load and the staff feed).

A rollout's view: its state, step progress, the event log, and the latest gate evaluation's
evidence (the evaluator's ``RolloutEvent.data["evidence"]``) laid out stable beside candidate.
The evidence is rendered generically: one group of rows per gate entry, a row per metric that
has a ``stable_…``/``candidate_…`` pair (or ``stable``/``candidate`` dicts), and the gate's
other numbers (thresholds, test statistics) as a note, so a gate added to the evaluator
(ITL, say) appears here without a change.

Besides the latest recorded evidence (written only when the evaluator acts), a running or
paused rollout gets a preview: the same gates over the current step's window, read from the
routers' per-version counters in Redis (``runtime.telemetry.versions.read_window``, the
evaluator's own source) with the evaluator's ``gate_results``; read only, nothing acts on it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis
from django.db.models import Prefetch, QuerySet

from apps.billing.models import Price
from apps.models.models import ModelVersion
from apps.rollouts import gates
from apps.rollouts.evaluate import gate_results, telemetry_namespace
from apps.rollouts.models import ACTIVE_STATES, TRAFFIC_STATES, Rollout, RolloutEvent
from apps.rollouts.transitions import candidate_share
from runtime.telemetry.versions import read_window

EVENTS_SHOWN = 30
SIDES = ("stable", "candidate")


def rollouts_recent(limit: int = 20) -> QuerySet[Rollout]:
    """The newest rollouts with their versions and events (two queries)."""
    return (
        Rollout.objects.select_related("model", "stable_version", "candidate_version")
        .prefetch_related(
            Prefetch("events", queryset=RolloutEvent.objects.order_by("created_at", "id"))
        )
        .order_by("-created_at")[:limit]
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        if not value:
            return "—"
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    return str(value)


def _pairs(numbers: Mapping[str, Any]) -> tuple[list[dict[str, str]], list[str]]:
    """Metric rows (stable beside candidate) and the rest as ``name value`` notes."""
    rows: list[dict[str, str]] = []
    paired: set[str] = set()
    for side in SIDES:  # {"stable": {"requests": 3, ...}, "candidate": {...}}
        if isinstance(numbers.get(side), Mapping):
            paired.add(side)
    if paired == set(SIDES):
        stable, candidate = numbers["stable"], numbers["candidate"]
        rows.extend(
            {
                "metric": name,
                "stable": _fmt(stable.get(name)),
                "candidate": _fmt(candidate.get(name)),
            }
            for name in dict.fromkeys([*stable, *candidate])
        )
    for key in numbers:  # stable_p95_ms beside candidate_p95_ms
        if key.startswith("stable_"):
            metric = key.removeprefix("stable_")
            twin = f"candidate_{metric}"
            if twin in numbers:
                paired.update((key, twin))
                rows.append(
                    {
                        "metric": metric,
                        "stable": _fmt(numbers[key]),
                        "candidate": _fmt(numbers[twin]),
                    }
                )
    notes = [f"{k} {_fmt(v)}" for k, v in numbers.items() if k not in paired]
    return rows, notes


def evidence_rows(evidence: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One entry per gate (plus the window's totals first), each with its metric rows."""
    if not evidence:
        return []
    groups: list[dict[str, Any]] = []
    totals = {side: evidence.get(side) for side in SIDES}
    if all(isinstance(v, Mapping) for v in totals.values()):
        rows, _ = _pairs(totals)
        groups.append(
            {"gate": "window totals", "decision": "", "test": "", "rows": rows, "notes": ""}
        )
    for gate in evidence.get("gates", []):
        if not isinstance(gate, Mapping):
            continue
        rows, notes = _pairs(gate.get("numbers") or {})
        groups.append(
            {
                "gate": str(gate.get("gate", "?")),
                "decision": str(gate.get("decision", "")),
                "test": str(gate.get("test", "")),
                "rows": rows,
                "notes": "; ".join(notes),
            }
        )
    return groups


def _event(event: RolloutEvent) -> dict[str, Any]:
    return {
        "at": event.created_at.isoformat(timespec="seconds"),
        "kind": event.kind,
        "from": event.from_state,
        "to": event.to_state,
        "step": event.step,
        "actor": event.actor_label,
        "reason": event.reason,
    }


def latest_evidence(events: Iterable[RolloutEvent]) -> tuple[dict[str, Any] | None, str]:
    """The newest event's evidence and when it was decided (ISO), or (None, "")."""
    found: tuple[dict[str, Any] | None, str] = (None, "")
    for event in events:  # oldest first
        evidence = (event.data or {}).get("evidence")
        if isinstance(evidence, dict):
            found = (evidence, event.created_at.isoformat(timespec="seconds"))
    return found


def _price(version: ModelVersion) -> list[float] | None:
    """Credits per 1k input and output tokens (the first hardware tier's, as the gate reads)."""
    price = Price.objects.filter(version=version).order_by("hardware_tier").first()
    return None if price is None else [float(price.input_per_1k), float(price.output_per_1k)]


def _share(rollout: Rollout) -> int:
    """The candidate's traffic share now: its step's while it may hold traffic, 100 once
    promoted, else 0."""
    if rollout.state == Rollout.State.PROMOTED:
        return 100
    if rollout.state not in TRAFFIC_STATES or not rollout.steps:
        return 0
    return candidate_share(rollout)


def gate_preview(
    rollout: Rollout, client: redis.Redis[bytes], now: float | None = None
) -> dict[str, Any] | None:
    """The gates over the current step's window so far (None unless it holds traffic)."""
    if rollout.state not in TRAFFIC_STATES or rollout.mode == Rollout.Mode.SHADOW:
        return None
    now = time.time() if now is None else now
    started = rollout.step_started_at.timestamp() if rollout.step_started_at else now
    since = max(started, now - rollout.step_window_s)
    stable_label, candidate_label = rollout.stable_version.label, rollout.candidate_version.label
    totals = read_window(
        client, namespace=telemetry_namespace(), model=rollout.model.name,
        versions=[stable_label, candidate_label], since=since, until=now,
    )  # fmt: skip
    stable, candidate = totals[stable_label], totals[candidate_label]
    results = gate_results(rollout, stable, candidate)
    return {
        "decision": gates.overall(results),
        "window_s": round(now - since, 1),
        "stable": stable.summary(),
        "candidate": candidate.summary(),
        "gates": [result.as_dict() for result in results],
    }


def rollout_view(rollout: Rollout, client: redis.Redis[bytes] | None = None) -> dict[str, Any]:
    """The rollout's view; with a Redis ``client``, its gate preview too."""
    events = list(rollout.events.all())
    evidence, decided_at = latest_evidence(events)
    preview = None if client is None else gate_preview(rollout, client)
    steps = [int(s) for s in rollout.steps]
    return {
        "id": rollout.pk,
        "model": rollout.model.name,
        "stable": rollout.stable_version.label,
        "candidate": rollout.candidate_version.label,
        "state": rollout.state,
        "state_label": rollout.get_state_display(),
        "mode": rollout.mode,
        "steps": steps,
        "current_step": rollout.current_step,
        "share": _share(rollout),
        "step_started_at": rollout.step_started_at.isoformat(timespec="seconds")
        if rollout.step_started_at
        else "",
        "events": [_event(e) for e in events[-EVENTS_SHOWN:]],
        "event_count": len(events),
        "evidence_at": decided_at,
        "evidence_decision": (evidence or {}).get("decision", ""),
        "evidence": evidence_rows(evidence),
        "preview_decision": "" if preview is None else preview["decision"],
        "preview_window_s": None if preview is None else preview["window_s"],
        "preview": evidence_rows(preview),
        # per 1k tokens [input, output], for the live cost column (active rollouts only)
        "prices": {
            "stable": _price(rollout.stable_version),
            "candidate": _price(rollout.candidate_version),
        }
        if rollout.state in ACTIVE_STATES
        else {},
    }
