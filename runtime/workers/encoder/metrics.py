"""The encoder worker's ``/metrics``: vLLM's request gauges plus the batcher's own series.

``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` carry vLLM's names so the
supervisor's drain check and the router's health probe read the encoder like any engine. The
batcher adds ``encoder:batch_size`` (histogram), ``encoder:batch_fill_ratio`` (histogram of
batch size / size cap), ``encoder:batch_compute_seconds`` (histogram), ``encoder:batches_total``
by release reason, ``encoder:wait_cap_seconds`` (the current wait cap at 128 tokens) and the
compute model's coefficients. One registry per server: nothing global.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from runtime.workers.encoder.batcher import Batch

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_FILL_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class EncoderMetrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = model
        labels = ["model_name"]
        self.running = Gauge(
            "vllm:num_requests_running", "Inputs being computed.", labels, registry=self.registry
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Inputs queued for a batch.",
            labels,
            registry=self.registry,
        )
        self.requests = Counter(
            "encoder:requests", "HTTP requests by route and status.",
            [*labels, "route", "status"], registry=self.registry,
        )  # fmt: skip
        self.batch_size = Histogram(
            "encoder:batch_size", "Inputs per computed batch.", labels,
            buckets=_SIZE_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.batch_fill = Histogram(
            "encoder:batch_fill_ratio", "Batch size over the size cap.", labels,
            buckets=_FILL_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.compute = Histogram(
            "encoder:batch_compute_seconds", "Seconds computing one batch.", labels,
            buckets=_SECONDS_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.batches = Counter(
            "encoder:batches", "Batches by release reason.", [*labels, "reason"],
            registry=self.registry,
        )  # fmt: skip
        self.wait_cap = Gauge(
            "encoder:wait_cap_seconds", "Current wait cap for 128-token inputs.", labels,
            registry=self.registry,
        )  # fmt: skip
        self.cost = Gauge(
            "encoder:compute_model", "Compute model t = a + b*batch*len.",
            [*labels, "coefficient"], registry=self.registry,
        )  # fmt: skip

    def on_batch(self, batch: Batch, seconds: float, max_batch: int) -> None:
        n = len(batch.jobs)
        self.batch_size.labels(self._model).observe(n)
        self.batch_fill.labels(self._model).observe(n / max_batch)
        self.compute.labels(self._model).observe(seconds)
        self.batches.labels(self._model, batch.reason).inc()

    def on_request(self, route: str, status: int) -> None:
        self.requests.labels(self._model, route, str(status)).inc()

    def render(
        self,
        *,
        running: int,
        waiting: int,
        wait_cap_s: float,
        coefficients: tuple[float, float],
        refresh: Callable[[], None] | None = None,
    ) -> bytes:
        self.running.labels(self._model).set(running)
        self.waiting.labels(self._model).set(waiting)
        self.wait_cap.labels(self._model).set(wait_cap_s)
        self.cost.labels(self._model, "fixed_s").set(coefficients[0])
        self.cost.labels(self._model, "per_token_s").set(coefficients[1])
        if refresh is not None:
            refresh()
        return generate_latest(self.registry)
