"""What a request gives the dispatcher (:class:`Ticket`) and gets back (:class:`Grant`), and
the ways it can fail before reaching an engine."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from runtime.routing.prefix import PromptPrefix
from runtime.scheduling.admission import Rejected
from runtime.scheduling.interfaces import DropReason, QueuedRequest
from runtime.snapshot import EndpointSnap

if TYPE_CHECKING:
    from runtime.scheduling.dispatcher import PoolDispatcher


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticket:
    """One request as the scheduler sees it. ``deadline`` is on the dispatcher's clock.

    ``on_queued``, when given, is called once if the request has to wait in the queue (not
    when it goes straight to an endpoint), with a function that tells its current 1-based
    position (None once it left the queue): the queued stream's heartbeats read it."""

    tenant: str
    version: int
    input_tokens: int  # what fairness charges; may bound the prompt from above (the gateway's)
    max_output_tokens: int
    band: int = 0
    class_name: str = ""
    shed_order: int = 0
    weight: float = 1.0
    deadline: float = math.inf
    affinity_key: str | None = None
    adapter: str | None = None  # the engine name of the LoRA adapter it needs (placement)
    prefix: PromptPrefix | None = field(default=None, compare=False)  # prompt block hashes
    is_shadow: bool = False
    on_queued: Callable[[Callable[[], int | None]], None] | None = field(
        default=None, compare=False
    )
    # The prompt's tokens as the engine prefills them, estimated; None: ``input_tokens``. The
    # gateway's ``input_tokens`` without a tokenizer is a byte bound, ~4x the tokens: the
    # prefill pacing and the victim choice, which estimate engine time, read this (#34).
    prefill_tokens: int | None = None

    @property
    def prefill(self) -> int:
        """The prompt's estimated prefill tokens (``prefill_tokens``, else ``input_tokens``)."""
        return self.input_tokens if self.prefill_tokens is None else self.prefill_tokens


class SchedulingError(Exception):
    """The request did not get an endpoint."""


class QueueRejectedError(SchedulingError):
    """Refused at the door of the queue (429): band full, or the wait would pass the deadline."""

    def __init__(self, rejection: Rejected) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


class QueueDropError(SchedulingError):
    """Left the queue without an endpoint: ``SHED`` (429) or ``DEADLINE_EXPIRED`` (504)."""

    def __init__(self, reason: DropReason, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class NoEndpointError(SchedulingError):
    """No endpoint of the request's version is usable at all (503); ``retry_after_s`` when a
    replica is starting (scale from zero) and the request's deadline cannot wait for it."""

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Preemptee(Protocol):
    """A running stream the dispatcher may stop to take its slot back (:mod:`.takeback`)."""

    def preemptible(self) -> bool:
        """Whether it may be stopped now (streaming, not ending, not moving)."""
        ...

    def preempt(self) -> None:
        """Stop its upstream at once (synchronously); it resumes through :meth:`Grant.resumed`."""
        ...


class Grant:
    """The right to send one request to ``endpoint``: holds its in-flight slot until
    :meth:`release` (idempotent). ``waited_s`` is the time spent queued.

    A preempted grant is *parked*: it holds no slot (``endpoint`` is None) and its request
    waits in the pool queue again, with its place, deadline and fairness charge, until
    :meth:`resumed` hands it a slot; :meth:`release` settles it in either state."""

    __slots__ = ("_dispatcher", "_released", "charged_output", "endpoint", "parked",
                 "preemptions", "request", "resume", "started_at", "ticket",
                 "waited_s")  # fmt: skip

    def __init__(
        self,
        dispatcher: PoolDispatcher,
        ticket: Ticket,
        request: QueuedRequest,
        endpoint: EndpointSnap,
        *,
        waited_s: float,
        started_at: float = 0.0,
    ) -> None:
        self._dispatcher = dispatcher
        self._released = False
        self.ticket = ticket
        self.request = request
        self.endpoint: EndpointSnap | None = endpoint
        self.waited_s = waited_s
        self.started_at = started_at  # dispatched (the dispatcher's clock)
        self.charged_output = 0
        self.parked = False  # preempted: no slot, queued again
        self.preemptions = 0
        self.resume: asyncio.Future[Grant] | None = None  # set while parked

    @property
    def takes_back(self) -> bool:
        """Whether its pool takes lent slots back by preemption (:meth:`preemptible`)."""
        return self._dispatcher.takes_back

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Free the slot (the request ended) and let the next queued request go."""
        if not self._released:
            self._released = True
            self._dispatcher.release(self)

    def preemptible(self, preemptee: Preemptee) -> None:
        """Offer the running stream ``preemptee`` to the pool's take-back (a pool that takes
        nothing back ignores it)."""
        if not self._released:
            self._dispatcher.offer(self, preemptee)

    async def resumed(self) -> EndpointSnap:
        """Wait, parked, for a slot again; the endpoint it got. Raises what a queued request
        gets: :class:`QueueDropError` (its deadline passed), :class:`NoEndpointError`."""
        if self.resume is None:
            raise RuntimeError("the grant was not preempted")
        await self.resume
        if self.endpoint is None:
            raise NoEndpointError("the preempted request lost its slot")
        return self.endpoint

    def reassign(self, exclude: frozenset[int]) -> EndpointSnap | None:
        """Give up the current endpoint for another (a retry): one with room, else the
        routing choice ignoring room; None when no endpoint is left."""
        if self._released:
            raise RuntimeError("the grant was already released")
        return self._dispatcher.reassign(self, exclude)

    def charge_output(self, tokens: int) -> None:
        """``tokens`` more output tokens streamed back (charged to the tenant's counter)."""
        if tokens > 0:
            self.charged_output += tokens
            self._dispatcher.charge_output(self, tokens)

    def settle_output(self, completion_tokens: int) -> None:
        """The final usage: charge what streaming counts missed (counters never fall)."""
        self.charge_output(completion_tokens - self.charged_output)


class Waiter:
    """A request waiting in its dispatcher's queue: its ticket, its queued form, the future
    its ``acquire`` awaits, and a preempted request's parked grant."""

    __slots__ = ("future", "grant", "req", "ticket")

    def __init__(self, ticket: Ticket, req: QueuedRequest, future: asyncio.Future[Grant],
                 grant: Grant | None = None) -> None:  # fmt: skip
        self.ticket = ticket
        self.req = req
        self.future = future
        self.grant = grant  # a preempted request's parked grant

    @property
    def prefill(self) -> int:
        """Its estimated prefill tokens: a resume's prompt plus what it generated."""
        return self.ticket.prefill + (self.grant.charged_output if self.grant else 0)
