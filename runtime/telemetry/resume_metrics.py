"""The router's metrics of resumed generations (stream migration and preemption).

- ``switchyard_preemptions_total{reason}``: streams the dispatcher stopped to take a slot
  back (reason ``lent_slot``: a slot the flood limit lent, for a tenant under its share);
- ``switchyard_stream_resumes_total{cause, reason, outcome}``: a stream that broke (cause
  ``migration``; reason: the break, ``disconnected`` / ``truncated`` / ``stalled`` /
  ``engine_error``) or was preempted (cause ``preemption``, reason ``lent_slot``), by
  outcome: ``resumed`` (its continuation streams on an endpoint), ``length`` (no output
  budget or context left: ended with ``finish_reason: "length"``), ``not_resumable`` (the
  request's shape cannot be continued), ``limit`` (it already moved
  ``SWITCHYARD_STREAM_MIGRATIONS`` times), ``failed`` (no endpoint opened the continuation
  within the deadline); a preempted stream also ``cancelled`` (the client went away while it
  waited for a slot) or ``deadline`` (its deadline passed while it waited);
- ``switchyard_resume_reprefill_tokens_total{cause}``: generated tokens sent again as
  prompt (what each resume costs the engine in prefill beyond the original prompt);
- ``switchyard_resume_seconds{cause}``: from the break (or the preemption) to the
  continuation's first event (the pause the client sees).

The counters live in the router's registry (created with it, per process; summed over
workers like the rest of :class:`runtime.telemetry.metrics.RouterMetrics`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

RESUME_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ResumeMetrics:
    """Counters and the pause histogram of resumed streams."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.preemptions_total = Counter(
            "switchyard_preemptions",
            "Streams stopped to take their slot back, by reason.",
            ["reason"],
            registry=registry,
        )
        self.resumes_total = Counter(
            "switchyard_stream_resumes",
            "Streams that broke or were preempted, by cause, reason and outcome.",
            ["cause", "reason", "outcome"],
            registry=registry,
        )
        self.reprefill_tokens = Counter(
            "switchyard_resume_reprefill_tokens",
            "Generated tokens sent again as prompt by a resume.",
            ["cause"],
            registry=registry,
        )
        self.resume_seconds = Histogram(
            "switchyard_resume_seconds",
            "From a stream's break to its continuation's first event.",
            ["cause"],
            buckets=RESUME_BUCKETS,
            registry=registry,
        )

    def preempted(self, *, reason: str) -> None:
        self.preemptions_total.labels(reason).inc()

    def outcome(self, *, cause: str, reason: str, outcome: str) -> None:
        self.resumes_total.labels(cause, reason, outcome).inc()

    def resumed(self, *, cause: str, reprefilled: int, seconds: float) -> None:
        self.reprefill_tokens.labels(cause).inc(max(reprefilled, 0))
        self.resume_seconds.labels(cause).observe(max(seconds, 0.0))
