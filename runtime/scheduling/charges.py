"""What each tenant of one pool is charged, and where it is recorded.

Service is token cost (input + 2 * output, :func:`.interfaces.token_cost`) over the tenant's
weight. :class:`Charges` records it in three places at once: the pool queue's fairness
counters (input tokens are charged there by ``pop`` itself; output tokens as they stream, and
service that bypassed the queue, here), the pool's served tokens (:class:`.served.ServedTokens`,
what the fairness telemetry reads) and the shared counters across routers (a
:class:`.ports.CounterSink`). It remembers every (band, tenant) it saw, so the counters can
be read back (:meth:`Charges.counters`) and carried into a rebuilt queue (:meth:`Charges.move`).
"""

from __future__ import annotations

from runtime.scheduling.interfaces import QueuedRequest, token_cost
from runtime.scheduling.ports import CounterSink
from runtime.scheduling.queue import PoolQueue
from runtime.scheduling.served import ServedTokens


class Charges:
    """One pool's charges (module docstring)."""

    __slots__ = ("_known", "_pool", "_sink", "queue", "served")

    def __init__(self, pool: str, queue: PoolQueue, sink: CounterSink | None) -> None:
        self._pool = pool
        self._sink = sink
        self.queue = queue
        self.served = ServedTokens()
        self._known: set[tuple[int, str]] = set()

    def dispatched(self, req: QueuedRequest, now: float) -> None:
        """``req`` was dispatched: its input tokens (the queue charged them at ``pop``)."""
        self._record(req.tenant, req.band, req.weight, req.input_tokens, 0, now)

    def output(self, req: QueuedRequest, tokens: int, now: float) -> None:
        """``tokens`` more output tokens of the dispatched ``req`` streamed back."""
        self.queue.lift_counter(req.band, req.tenant, 0.0)  # make sure the band exists
        self.queue.charge_output(req, tokens)
        self._record(req.tenant, req.band, req.weight, 0, tokens, now)

    def bypass(  # noqa: PLR0917 - the service's fields, in their usual order
        self, tenant: str, band: int, weight: float, input_tokens: int, output_tokens: int,
        now: float,
    ) -> None:  # fmt: skip
        """Service answered without the queue (a cache hit, at its cheaper weight)."""
        self.queue.charge(band, tenant, weight=weight, input_tokens=input_tokens,
                          output_tokens=output_tokens)  # fmt: skip
        self._record(tenant, band, weight, input_tokens, output_tokens, now)

    def lift(self, band: int, tenant: str, value: float) -> None:
        """Raise a fairness counter to the global value (shared counters' sync)."""
        self._known.add((band, tenant))
        self.queue.lift_counter(band, tenant, value)

    def counters(self) -> dict[tuple[int, str], float]:
        return {(b, t): self.queue.counter(b, t) for b, t in self._known}

    def move(self, queue: PoolQueue) -> None:
        """Charge into ``queue`` (rebuilt by a settings change) from now on, with every
        counter carried over."""
        for band, tenant in self._known:
            queue.lift_counter(band, tenant, self.queue.counter(band, tenant))
        self.queue = queue

    def _record(  # noqa: PLR0917 - private, positional by design
        self, tenant: str, band: int, weight: float, input_tokens: int, output_tokens: int,
        now: float,
    ) -> None:  # fmt: skip
        self._known.add((band, tenant))
        self.served.add(tenant, weight=weight, input_tokens=input_tokens,
                        output_tokens=output_tokens, now=now)  # fmt: skip
        if self._sink is not None:
            amount = token_cost(input_tokens, output_tokens) / weight
            self._sink.record(self._pool, band, tenant, amount)
