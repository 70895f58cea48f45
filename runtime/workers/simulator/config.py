"""The simulator's parameters (all set from the command line, see ``__main__``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.workers.simulator.prefix_cache import PrefixCacheConfig
from runtime.workers.simulator.timing import Capacity, TimingModel


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """Everything one simulated endpoint needs; validated on construction (``ValueError``)."""

    model: str
    timing: TimingModel = field(default_factory=TimingModel)
    capacity: Capacity = field(default_factory=Capacity)
    max_model_len: int = 4096
    seed: int = 0
    fail_after_tokens: int | None = None
    error_rate: float = 0.0  # fault injection: this fraction of generations answer HTTP 500
    embedding_dim: int = 384
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    max_loras: int = 0  # LoRA adapters loadable at run time (simulator/lora.py); 0 = off
    max_cpu_loras: int = 0  # adapters kept loaded at once; 0: max_loras (vLLM's default)
    lora_load_ms: float = 50.0  # one adapter load's cost (vLLM CPU, demo adapter: ~60 ms)
    kv_events_endpoint: str | None = None  # publish KV events (vLLM's format) on this ZMQ PUB

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a non-empty name")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_model_len > self.capacity.kv_capacity_tokens:
            # vLLM refuses to start when one full-length sequence cannot fit in the KV cache.
            raise ValueError(
                f"max_model_len ({self.max_model_len}) is larger than kv_capacity_tokens "
                f"({self.capacity.kv_capacity_tokens}): one full-length sequence must fit"
            )
        if self.fail_after_tokens is not None and self.fail_after_tokens < 0:
            raise ValueError("fail_after_tokens must be >= 0")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {self.error_rate}")
        if min(self.max_loras, self.max_cpu_loras, self.lora_load_ms) < 0:
            raise ValueError("max_loras, max_cpu_loras and lora_load_ms must be >= 0")
        if self.kv_events_endpoint is not None and not self.prefix_cache.enabled:
            raise ValueError("KV events need the prefix cache (--prefix-cache-blocks > 0)")
        if self.embedding_dim < 1:
            raise ValueError("embedding_dim must be >= 1")
