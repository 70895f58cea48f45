"""The worker's own compute-time model: seconds for a batch of ``n`` inputs padded to ``L`` tokens.

``t(n, L) ≈ a + b · n · L``, fitted online by least squares over exponentially decayed
sums, so it follows the machine it runs on (thread count, other load). Until it has seen two
distinct sizes it answers from a prior. The batcher uses it to turn a class SLO into a wait cap
(``W <= SLO - t(n, L) - margin``) and to release a batch early enough for the earliest deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

_MIN_SPREAD = 1e-9


@dataclass(slots=True)
class ComputeModel:
    prior_fixed_s: float = 0.003
    prior_per_token_s: float = 2e-5
    decay: float = 0.97  # weight kept by the past at each observation
    _n: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0
    observations: int = 0

    def observe(self, batch: int, seq_len: int, seconds: float) -> None:
        """Record one measured batch."""
        if batch < 1 or seq_len < 1 or seconds < 0:
            return
        x = float(batch * seq_len)
        d = self.decay
        self._n = self._n * d + 1.0
        self._sx = self._sx * d + x
        self._sy = self._sy * d + seconds
        self._sxx = self._sxx * d + x * x
        self._sxy = self._sxy * d + x * seconds
        self.observations += 1

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: fixed seconds per batch and seconds per padded token."""
        if self._n <= 0:
            return self.prior_fixed_s, self.prior_per_token_s
        mean_x = self._sx / self._n
        mean_y = self._sy / self._n
        var_x = self._sxx / self._n - mean_x * mean_x
        if var_x <= _MIN_SPREAD * max(1.0, mean_x * mean_x):
            # one size seen so far: keep the prior's split, scale it to what was measured
            prior = self.prior_fixed_s + self.prior_per_token_s * mean_x
            scale = mean_y / prior if prior > 0 else 1.0
            return self.prior_fixed_s * scale, self.prior_per_token_s * scale
        b = (self._sxy / self._n - mean_x * mean_y) / var_x
        b = max(b, 0.0)
        a = max(mean_y - b * mean_x, 0.0)
        return a, b

    def predict(self, batch: int, seq_len: int) -> float:
        a, b = self.coefficients()
        return a + b * max(batch, 0) * max(seq_len, 0)
