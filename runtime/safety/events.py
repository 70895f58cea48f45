"""Interventions as events: what the router tells the control plane, never the content.

Each refusal, redaction or stop becomes one :class:`Intervention`; the gateway's stage
publishes it on a stream the control plane consumes into the audit log (as usage events are),
and counts it in a metric by rule and action. No prompt or answer text is in it, by design: the
struct has no field that could carry it.
"""

from __future__ import annotations

import time

import msgspec

from runtime.safety.postfilter import Stop
from runtime.safety.prefilter import Verdict


class Intervention(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    key: str  # the API key's prefix
    model: str
    request_id: str
    stage: str  # "input" | "output"
    action: str  # "refuse" | "redact" | "stop" | "pass" (a classifier down, failed open)
    pack: str
    rule: str
    matches: int = 1  # redact: how many matches of the rule were replaced
    failed: str = ""  # classifier down: "open" | "closed"
    at: float = 0.0  # unix seconds


def input_events(
    verdict: Verdict, *, tenant: str, key: str, model: str, request_id: str,
    at: float | None = None,
) -> list[Intervention]:  # fmt: skip
    """The events of a pre-filter (or input classifier) verdict; none for a plain pass."""
    when = time.time() if at is None else at

    def event(action: str, pack: str, rule: str, matches: int = 1) -> Intervention:
        return Intervention(tenant=tenant, key=key, model=model, request_id=request_id,
                            stage="input", action=action, pack=pack, rule=rule,
                            matches=matches, failed=verdict.failed, at=when)  # fmt: skip

    if verdict.action == "redact":
        return [event("redact", pack, rule, n) for pack, rule, n in verdict.redacted]
    if verdict.action == "refuse" or verdict.failed:
        return [event(verdict.action, verdict.pack, verdict.rule)]
    return []


def output_event(
    stop: Stop, *, tenant: str, key: str, model: str, request_id: str, at: float | None = None
) -> Intervention:
    """The event of a stream (or unary answer) stopped by the post-filter."""
    return Intervention(tenant=tenant, key=key, model=model, request_id=request_id,
                        stage="output", action="stop", pack=stop.pack, rule=stop.rule,
                        at=time.time() if at is None else at)  # fmt: skip
