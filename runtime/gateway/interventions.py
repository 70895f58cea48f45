"""Off-path report of safety interventions: a metric at once, the event to Redis in batches.

The request path calls :meth:`InterventionRecorder.record` (no I/O): it counts the event in
``switchyard_safety_interventions_total{stage, action, pack, rule}`` and keeps it for the next
flush, which appends the batch to the stream :func:`runtime.contract.safety_stream` (one
pipeline of ``XADD``, capped at :data:`STREAM_MAXLEN` entries). The control plane's consumer
(``apps.safety.consume``) writes each into the audit log. A failed flush keeps the batch for
the next one (up to :data:`MAX_PENDING` events; older ones are dropped and counted).
"""

from __future__ import annotations

import logging

import msgspec
from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import RedisError

from runtime.contract import safety_stream
from runtime.flusher import PeriodicFlusher
from runtime.safety.events import Intervention

logger = logging.getLogger(__name__)
STREAM_MAXLEN = 100_000
MAX_PENDING = 10_000
_ENCODER = msgspec.json.Encoder()


class InterventionRecorder(PeriodicFlusher):
    def __init__(
        self, redis_url: str, *, namespace: str, registry: CollectorRegistry | None,
        interval_s: float = 1.0,
    ) -> None:  # fmt: skip
        super().__init__(redis_url, interval_s=interval_s, name="switchyard-safety-events")
        self._stream = safety_stream(namespace)
        self._pending: list[Intervention] = []
        self.total = Counter(
            "switchyard_safety_interventions_total",
            "Safety interventions (refuse, redact, stop; pass: a classifier down, failed open).",
            ["stage", "action", "pack", "rule"],
            registry=registry,
        )
        self.dropped = Counter(
            "switchyard_safety_events_dropped_total",
            "Intervention events dropped while Redis was unreachable (the metric still counts).",
            registry=registry,
        )

    def record(self, event: Intervention) -> None:
        """Count ``event`` and keep it for the next flush (no I/O)."""
        self.total.labels(event.stage, event.action, event.pack, event.rule).inc()
        self._pending.append(event)
        if len(self._pending) > MAX_PENDING:
            del self._pending[0]
            self.dropped.inc()

    async def flush(self) -> int:
        """Append the pending events to the stream; returns how many (0 on failure)."""
        if not self._pending or self._client is None:
            return 0
        batch, self._pending = self._pending, []
        try:
            pipe = self._client.pipeline(transaction=False)
            for event in batch:
                pipe.xadd(self._stream, {"event": _ENCODER.encode(event)},
                          maxlen=STREAM_MAXLEN, approximate=True)  # fmt: skip
            await pipe.execute()
        except (RedisError, OSError) as exc:
            logger.warning("safety events: flush of %d failed (%r); will retry", len(batch), exc)
            self._pending = batch + self._pending
            return 0
        return len(batch)
