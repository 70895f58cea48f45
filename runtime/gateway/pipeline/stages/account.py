"""Step ``account``: a finished request (answered, refused, failed, cancelled or cut) into
the metrics, SLIs, the autoscaler's TTFT signal, tracing, the live view, the request log and
the per-version stats of rollout gates. It runs once per request, after the pipeline (and its
releases) ended, from the consumer: for a detached request (an ``Idempotency-Key``'s first)
when its client's part ended."""

from __future__ import annotations

import asyncio
import time

from runtime.gateway.bundles import Telemetry
from runtime.gateway.errors import ApiError
from runtime.telemetry.logging import RequestRecord, log_request
from runtime.telemetry.metrics import StageLabels


def classify(record: RequestRecord, error: BaseException, cut_reason: str | None) -> None:
    """The record's status and outcome for a request that ended by ``error``."""
    if isinstance(error, ApiError):
        record.status, record.outcome = error.status, error.code or "error"
    elif isinstance(error, asyncio.CancelledError):
        if cut_reason is not None:  # the router's grace period ended
            record.status, record.outcome = record.status or 503, cut_reason
        else:
            record.status, record.outcome = record.status or 499, "client_disconnected"
    else:
        record.status, record.outcome = record.status or 500, "internal_error"


class Account:
    name = "account"

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry

    def __call__(self, record: RequestRecord, labels: StageLabels) -> None:
        telemetry = self._telemetry
        metrics, snapshot = telemetry.metrics, telemetry.snapshot()
        elapsed = time.monotonic() - record.started
        record.timing("e2e", elapsed)
        metrics.observe("e2e", elapsed, labels)
        auth_ms = record.timings_ms.get("auth")
        if auth_ms is not None:
            metrics.observe("auth", auth_ms / 1000.0, labels)
        metrics.count(
            model=labels.model, klass=labels.klass, outcome=record.outcome, tenant=record.tenant
        )
        metrics.observe_slis(record, snapshot)
        if telemetry.scaling is not None:  # TTFT against the class SLO, for the autoscaler
            telemetry.scaling.observe_request(record, snapshot)
        telemetry.tracing.finish(record)
        if telemetry.live is not None:
            telemetry.live.record(record)
        log_request(telemetry.request_log, record)
        telemetry.version_stats.record_request(record)  # per-version telemetry for rollout gates
