"""Prices in the data plane: credits per token of a version on a hardware tier.

A request's cost is ``input * input price + output * output price`` (credits per 1k tokens
in the snapshot), with the cache-hit discount taken off for a cached answer, rounded up to
whole micro-credits. The worst case reserved at admission is the same formula with the
estimated prompt and ``max_tokens`` of output. A Batch API line (sent with its batch's key)
is priced at :meth:`Rate.for_batch`: both token prices less the price's batch discount.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.snapshot import PriceSnap, Snapshot

MICRO = 1_000_000
"""Micro-credits per credit (the ledger keeps six decimal places)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """Micro-credits per token of one version on one hardware tier."""

    input_uc: float
    output_uc: float
    cache_hit_discount: float = 0.0
    batch_discount: float = 0.0

    @classmethod
    def of(cls, price: PriceSnap) -> Rate:
        # credits per 1k tokens -> micro-credits per token: * 1e6 / 1e3
        return cls(
            input_uc=price.input_per_1k * (MICRO / 1000),
            output_uc=price.output_per_1k * (MICRO / 1000),
            cache_hit_discount=min(1.0, max(0.0, price.cache_hit_discount)),
            batch_discount=min(1.0, max(0.0, price.batch_discount)),
        )

    def for_batch(self) -> Rate:
        """The rate of a Batch API line: the token prices less the batch discount."""
        if self.batch_discount <= 0.0:
            return self
        keep = 1.0 - self.batch_discount
        return Rate(
            input_uc=self.input_uc * keep, output_uc=self.output_uc * keep,
            cache_hit_discount=self.cache_hit_discount,
        )  # fmt: skip

    @property
    def free(self) -> bool:
        return self.input_uc <= 0 and self.output_uc <= 0

    def cost(self, input_tokens: int, output_tokens: int, *, cached: bool = False) -> int:
        """Whole micro-credits (rounded up) for this many tokens."""
        raw = max(0, input_tokens) * self.input_uc + max(0, output_tokens) * self.output_uc
        if cached:
            raw *= 1.0 - self.cache_hit_discount
        return math.ceil(raw - 1e-9) if raw > 0 else 0


class PriceBook:
    """(version id, hardware tier) -> :class:`Rate`, built once per snapshot."""

    __slots__ = ("_rates", "version")

    def __init__(self, snapshot: Snapshot) -> None:
        self.version = snapshot.version
        self._rates = {(p.version, p.hardware_tier): Rate.of(p) for p in snapshot.prices}

    def rate(self, version: int, hardware_tier: str) -> Rate | None:
        """The rate, or None when the version has no price on that tier (it is free)."""
        return self._rates.get((version, hardware_tier))


def to_credits(micro: int) -> str:
    """Micro-credits as a decimal string of credits (``1500000`` -> ``"1.500000"``)."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(int(micro)), MICRO)
    return f"{sign}{whole}.{frac:06d}"
