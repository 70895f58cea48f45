"""A version with no usable endpoint: its requests wait while a replica starts (scale from
zero) when their deadline covers the start time, else they are refused with 503
(:class:`~.grant.NoEndpointError`, ``Retry-After`` the start time when one is starting).
``cold_start`` (the autoscaler's) tells a version's expected start seconds, None when no
replica can start."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from runtime.scheduling.grant import NoEndpointError, Ticket
from runtime.scheduling.ports import Placement

ColdStart = Callable[[int], float | None]


def hold_or_refuse(cold_start: ColdStart | None, pool: str, ticket: Ticket, now: float) -> None:
    """``ticket``'s version has no usable endpoint: return if it may wait for one to start,
    else raise :class:`NoEndpointError`."""
    start_s = cold_start(ticket.version) if cold_start is not None else None
    if start_s is None:
        raise NoEndpointError(f"no usable endpoint serves the pool '{pool}' version")
    if ticket.deadline - now < start_s:
        raise NoEndpointError(
            f"no replica of this version is ready and starting one takes about "
            f"{start_s:.1f} s, longer than the request's deadline allows",
            retry_after_s=max(1, math.ceil(start_s)),
        )


def stranded(
    placement: Placement, cold_start: ColdStart | None, versions: Iterable[int]
) -> set[int]:
    """The ``versions`` that lost every usable endpoint and cannot start one."""
    return {
        v
        for v in set(versions)
        if not placement.candidates(v, frozenset())
        and (cold_start is None or cold_start(v) is None)
    }
