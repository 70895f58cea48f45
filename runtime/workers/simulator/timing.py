"""The simulator's timing model: what one engine step costs.

One engine step admits waiting requests, prefills their prompts and runs one decode step for
every running sequence, so every running sequence gets one token at the end of the step::

    step_seconds = new_prompt_tokens / prefill_tps + (decode_a_ms + decode_b_ms * batch) / 1000

Prefill is not chunked: a step that admits a long prompt delays every sequence in the batch,
as prefill does on a real engine without chunked prefill.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TimingModel:
    """Prefill throughput and the linear decode step cost ``a + b * batch_size``."""

    prefill_tps: float = 5000.0
    decode_a_ms: float = 10.0
    decode_b_ms: float = 0.5

    def __post_init__(self) -> None:
        if not self.prefill_tps > 0:
            raise ValueError(f"prefill_tps must be > 0, got {self.prefill_tps}")
        if self.decode_a_ms < 0 or self.decode_b_ms < 0:
            raise ValueError("decode_a_ms and decode_b_ms must be >= 0")

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """Seconds to prefill ``prompt_tokens`` tokens."""
        if prompt_tokens < 0:
            raise ValueError("prompt_tokens must be >= 0")
        return prompt_tokens / self.prefill_tps

    def decode_step_seconds(self, batch_size: int) -> float:
        """Seconds for one decode step over ``batch_size`` sequences (0 when the batch is empty)."""
        if batch_size < 0:
            raise ValueError("batch_size must be >= 0")
        if batch_size == 0:
            return 0.0
        return (self.decode_a_ms + self.decode_b_ms * batch_size) / 1000.0

    def step_seconds(self, *, batch_size: int, prefill_tokens: int) -> float:
        """One engine step: prefill of the newly admitted prompts plus a decode step."""
        return self.prefill_seconds(prefill_tokens) + self.decode_step_seconds(batch_size)

    def tokens_per_second(self, batch_size: int) -> float:
        """Steady-state decode throughput of the whole batch (no prefill), tokens/s."""
        step = self.decode_step_seconds(batch_size)
        return batch_size / step if step > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class Capacity:
    """The two admission limits: concurrent sequences and KV-cache tokens.

    A sequence reserves ``prompt_tokens + max_tokens`` KV tokens at admission and keeps them
    until it finishes (no preemption, no paging), so admission never has to evict anyone.
    """

    max_num_seqs: int = 64
    kv_capacity_tokens: int = 65536

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")

    def admits(self, *, running: int, kv_used: int, kv_needed: int) -> bool:
        """Whether one more sequence needing ``kv_needed`` tokens fits now."""
        return running < self.max_num_seqs and kv_used + kv_needed <= self.kv_capacity_tokens

    def kv_usage(self, kv_used: int) -> float:
        """KV-cache usage as a fraction in [0, 1] (vLLM's ``kv_cache_usage_perc``)."""
        return min(1.0, kv_used / self.kv_capacity_tokens)
