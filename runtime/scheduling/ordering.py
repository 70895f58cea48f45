"""Ordering policies: which of one tenant's queued requests goes first."""

from __future__ import annotations

from typing import ClassVar

from runtime.scheduling.interfaces import QueuedRequest


class EarliestDeadlineFirst:
    """Earliest deadline first; equal deadlines (e.g. none) in arrival order."""

    name: ClassVar[str] = "edf"

    __slots__ = ()

    def less(self, a: QueuedRequest, b: QueuedRequest) -> bool:
        return (a.deadline, a.seq) < (b.deadline, b.seq)


class ArrivalOrder:
    """First come, first served: arrival sequence number."""

    name: ClassVar[str] = "fcfs"

    __slots__ = ()

    def less(self, a: QueuedRequest, b: QueuedRequest) -> bool:
        return a.seq < b.seq
