"""Strict priority bands with a guaranteed minimum share for lower bands.

The rule, precisely. Band numbers are priorities (0 is the most urgent). A band ``b`` with a
configured share ``s_b`` (0 <= s_b < 1) is *contended* at a dispatch when it holds queued
requests and some more urgent band holds queued requests too. It carries a deficit ``D_b``
in token-cost units (the dispatched requests' estimated cost: input + 2 * expected output).

1. Choosing the band: the most urgent contended band with ``D_b > 0``; if there is none, the
   most urgent band that holds queued requests (strict priority).
2. Accounting, with ``c`` the cost of the request just dispatched (from any band): every
   contended band gains ``D_b += s_b * c``, and the band it came from, if contended, pays
   ``D_b -= c``. A band not contended at this dispatch keeps its debt but loses any credit:
   ``D_b = min(D_b, 0)``. Credit is never banked across a stretch without contention, and
   debt is never forgiven (so a band cannot take more than its share by trickling requests
   in one at a time).

With two bands, ``D`` stays in ``(-(1 - s) * c_max(lower), s * c_max(upper)]`` (it grows only
while ``D <= 0`` and is spent only while ``D > 0``). Hence, with ``T`` the cost dispatched
over a window and ``S`` the part from the lower band:

- over any window, counting only the dispatches at which the lower band was contended,
  ``S <= s * T + s * c_max(upper) + (1 - s) * c_max(lower)`` — an urgent request never waits
  behind more lower-band work than the share allows, plus one request of each band;
- over any run of consecutive dispatches at which the lower band was contended,
  ``S >= s * T - s * c_max(upper) - (1 - s) * c_max(lower)`` — the lower band is never
  starved: it gets its share, minus one request of each band.

With more bands each deficit stays bounded too (a more urgent owed band may go first, for a
bounded while), so the same holds with a larger constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


class BandShares:
    """Deficit accounting for the guaranteed shares. Explicit, per pool queue."""

    __slots__ = ("_deficits", "_shares")

    def __init__(self, shares: Mapping[int, float] | None = None) -> None:
        cleaned: dict[int, float] = {}
        for band, share in (shares or {}).items():
            if not (math.isfinite(share) and 0 <= share < 1):
                raise ValueError(f"band {band}: minimum share must be in [0, 1), got {share!r}")
            if share > 0:
                cleaned[band] = share
        if sum(cleaned.values()) >= 1:
            raise ValueError("the bands' minimum shares must add up to less than 1")
        self._shares = cleaned
        self._deficits: dict[int, float] = dict.fromkeys(cleaned, 0.0)

    @property
    def shares(self) -> Mapping[int, float]:
        return dict(self._shares)

    def deficit(self, band: int) -> float:
        """The band's current deficit ``D_b`` (positive: it is owed service)."""
        return self._deficits.get(band, 0.0)

    def choose(self, backlogged: Sequence[int]) -> int:
        """The band to serve, given the bands holding queued requests in ascending order."""
        if not backlogged:
            raise ValueError("no band holds queued requests")
        deficits = self._deficits
        for band in backlogged[1:]:
            if deficits.get(band, 0.0) > 0:
                return band
        return backlogged[0]

    def record(self, backlogged: Sequence[int], served: int, cost: float) -> None:
        """Account one dispatch of ``cost`` from ``served``; ``backlogged`` as in ``choose``."""
        contended = set(backlogged[1:])
        for band, share in self._shares.items():
            if band not in contended:
                self._deficits[band] = min(self._deficits[band], 0.0)
                continue
            value = self._deficits[band] + share * cost
            if band == served:
                value -= cost
            self._deficits[band] = value
