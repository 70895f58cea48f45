"""Deadline-aware admission into a pool queue: enqueue, or reject now with a reason.

A request whose estimated wait (work ahead / drain rate) would take it past its deadline is
rejected at once (429) instead of timing out later with 504: the client learns early and gets
a ``Retry-After`` from the same estimate, plus its would-be position in the queue. A full band
(or pool) is a 429 too. Under a pool-wide bound the queue sheds the most sheddable request to
make room (see :func:`runtime.scheduling.queue.shed_key`); those are returned so the caller
answers them.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.scheduling.drain import DrainRate, retry_after_s
from runtime.scheduling.interfaces import DropReason, QueuedRequest
from runtime.scheduling.queue import PoolQueue, QueueFull


@dataclass(frozen=True, slots=True)
class Admitted:
    position: int  # 1-based estimated position in the queue
    estimated_wait_s: float
    displaced: tuple[QueuedRequest, ...] = ()  # shed to make room; answer each with 429


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: DropReason
    retry_after_s: int
    position: int  # where it would have stood
    estimated_wait_s: float
    message: str
    status: int = 429


def admit(
    queue: PoolQueue, drain: DrainRate, req: QueuedRequest, *, now: float
) -> Admitted | Rejected:
    """Push ``req`` into ``queue`` unless it cannot make its deadline or does not fit."""
    ahead = queue.ahead(req)
    wait = drain.estimated_wait(ahead.cost)
    position = ahead.requests + 1
    if now + wait > req.deadline:
        return Rejected(
            reason=DropReason.WAIT_EXCEEDS_DEADLINE,
            retry_after_s=retry_after_s(wait),
            position=position,
            estimated_wait_s=wait,
            message=(
                f"estimated queue wait {wait:.1f}s exceeds the request deadline "
                f"({max(req.deadline - now, 0.0):.1f}s left); position {position}"
            ),
        )
    try:
        displaced = queue.push(req)
    except QueueFull as full:
        return Rejected(
            reason=DropReason.QUEUE_FULL,
            retry_after_s=retry_after_s(wait),
            position=position,
            estimated_wait_s=wait,
            message=f"{full}; position would be {position}",
        )
    drain.observe(now=now, queued=len(queue))
    return Admitted(position=position, estimated_wait_s=wait, displaced=tuple(displaced))
