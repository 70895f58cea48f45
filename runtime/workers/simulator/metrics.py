"""Prometheus metrics under vLLM's names (as vLLM 0.32's ``vllm/v1/metrics/loggers.py``).

Every series carries vLLM's labels ``model_name`` (the served model name) and ``engine``
(always "0": one engine core). Histogram buckets are vLLM's defaults. The gauges read the
engine when scraped. ``vllm:kv_cache_usage_perc`` is the fraction (0..1) of KV tokens that
running sequences have reserved (prompt + output budget: the simulator does not page).
``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` count, per admitted request, its
prompt tokens and those of them found in the prefix cache (as vLLM's ``PrefixCacheStats``).
Each app owns its ``CollectorRegistry``; nothing touches the global registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from runtime.workers.simulator.engine import Engine, Sequence

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")
_LABELS = ("model_name", "engine")


class SimulatorMetrics:
    """vLLM's metric families for one simulated endpoint; an ``EngineObserver``."""

    def __init__(self, *, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = (model_name, "0")
        reg = self.registry
        self._running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            _LABELS, registry=reg,
        ).labels(*labels)  # fmt: skip
        self._waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            _LABELS, registry=reg,
        ).labels(*labels)  # fmt: skip
        self._kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            _LABELS, registry=reg,
        ).labels(*labels)  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", _LABELS, registry=reg
        ).labels(*labels)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.",
            _LABELS, registry=reg,
        ).labels(*labels)  # fmt: skip
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            _LABELS, registry=reg,
        ).labels(*labels)  # fmt: skip
        success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            (*_LABELS, "finished_reason"), registry=reg,
        )  # fmt: skip
        self.request_success = {r: success.labels(*labels, r) for r in FINISH_REASONS}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            _LABELS, registry=reg, buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
        ).labels(*labels)  # fmt: skip
        self.inter_token = Histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            _LABELS, registry=reg, buckets=INTER_TOKEN_LATENCY_BUCKETS,
        ).labels(*labels)  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            _LABELS, registry=reg, buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(*labels)  # fmt: skip
        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            _LABELS, registry=reg,
        ).labels(*labels)  # fmt: skip
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            _LABELS, registry=reg,
        ).labels(*labels)  # fmt: skip
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _LABELS, registry=reg, buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(*labels)  # fmt: skip

    def bind(self, engine: Engine) -> None:
        """Make the gauges read ``engine``'s state at scrape time."""
        self._running.set_function(lambda: float(engine.num_running))
        self._waiting.set_function(lambda: float(engine.num_waiting))
        self._kv_usage.set_function(lambda: engine.kv_usage)

    def exposition(self) -> bytes:
        """The Prometheus text format (version 0.0.4, as vLLM serves it)."""
        return generate_latest(self.registry)

    # -- EngineObserver ----------------------------------------------------------------------
    def on_admitted(self, seq: Sequence, queue_seconds: float) -> None:
        self.prompt_tokens.inc(seq.prompt_tokens)
        self.prefix_cache_queries.inc(seq.prompt_tokens)
        self.prefix_cache_hits.inc(seq.cached_tokens)
        self.queue_time.observe(queue_seconds)

    def on_token(self, seq: Sequence, latency_seconds: float, *, first: bool) -> None:
        self.generation_tokens.inc()
        if first:
            self.ttft.observe(latency_seconds)
        else:
            self.inter_token.observe(latency_seconds)

    def on_finished(self, seq: Sequence, reason: str, e2e_seconds: float) -> None:
        counter = self.request_success.get(reason)
        if counter is not None:
            counter.inc()
        if reason != "abort":
            self.e2e.observe(e2e_seconds)
