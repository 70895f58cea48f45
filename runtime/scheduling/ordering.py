"""Ordering policies: which of one tenant's queued requests goes first.

A preempted request re-queued to resume first (``QueuedRequest.resumes``, the pool policy
``resume_first``, :mod:`.takeback`) goes before its tenant's others under either policy."""

from __future__ import annotations

from typing import ClassVar

from runtime.scheduling.interfaces import QueuedRequest


class EarliestDeadlineFirst:
    """Earliest deadline first; equal deadlines (e.g. none) in arrival order."""

    name: ClassVar[str] = "edf"

    __slots__ = ()

    def less(self, a: QueuedRequest, b: QueuedRequest) -> bool:
        return (not a.resumes, a.deadline, a.seq) < (not b.resumes, b.deadline, b.seq)


class ArrivalOrder:
    """First come, first served: arrival sequence number."""

    name: ClassVar[str] = "fcfs"

    __slots__ = ()

    def less(self, a: QueuedRequest, b: QueuedRequest) -> bool:
        return (not a.resumes, a.seq) < (not b.resumes, b.seq)
