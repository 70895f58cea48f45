"""The router's own count of requests in flight per endpoint (this process only)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class InFlight:
    """Incremented on dispatch, decremented when the request ends (in a ``finally``)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def get(self, endpoint_id: int) -> int:
        return self._counts.get(endpoint_id, 0)

    def acquire(self, endpoint_id: int) -> None:
        self._counts[endpoint_id] = self._counts.get(endpoint_id, 0) + 1

    def release(self, endpoint_id: int) -> None:
        count = self._counts.get(endpoint_id, 0) - 1
        if count > 0:
            self._counts[endpoint_id] = count
        else:
            self._counts.pop(endpoint_id, None)

    @contextmanager
    def track(self, endpoint_id: int) -> Iterator[None]:
        self.acquire(endpoint_id)
        try:
            yield
        finally:
            self.release(endpoint_id)

    def total(self) -> int:
        return sum(self._counts.values())

    def snapshot(self) -> dict[int, int]:
        return dict(self._counts)

    def retain(self, endpoint_ids: Iterable[int]) -> None:
        """Forget endpoints no longer known (their in-flight requests release into nothing)."""
        keep = set(endpoint_ids)
        for endpoint_id in [e for e in self._counts if e not in keep]:
            del self._counts[endpoint_id]
