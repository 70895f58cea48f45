"""Active health checks and load gauges for every endpoint in the snapshot, plus passive evidence.

One task per endpoint scrapes ``/metrics`` every ``interval_s`` (vLLM's gauges: requests
running and waiting, KV-cache use) and checks ``/health`` every ``health_every`` intervals.
An *idle* endpoint is scraped only at ``idle_interval_s`` (by default the ``/health`` period,
``interval_s x health_every``), each time with ``/health``: idle means its last scrape
answered with nothing running and nothing waiting (or without gauges), no probe failure is
pending, and this router got no first byte from it since the scrape before. A first byte
(:meth:`note_success`) wakes an idle endpoint's scrape at once and it is scraped at
``interval_s`` again. Freshness: a busy endpoint's gauges are at most ``interval_s`` old (as
before); an idle one's at most ``idle_interval_s`` (they say "idle", and placement counts the
router's own requests in flight on top); ``/health`` runs every ``health_every x interval_s``
in both modes, so the detection of a failing ``/health`` is unchanged, and a failing scrape of
an idle endpoint is seen at most ``idle_interval_s`` later, its run then counted at
``interval_s``.
The router reads the latest :class:`EndpointStatus` synchronously (:meth:`status`). An
endpoint is healthy once a scrape and a health check have succeeded and until
``unhealthy_after`` consecutive failures of either; one success of that kind recovers it.
Until both have answered once, an endpoint counts as usable (the snapshot says it is ready)
unless a probe failed definitely or ``unhealthy_after`` probes in a row got no answer: a
router whose first probes time out (its loop stalled at start, the engine busy) must not
refuse every request for the model until the next answer.
A worker without ``/metrics`` (404) is judged by ``/health`` alone and reports no gauges.

Passive evidence: the router tells the monitor whenever a real request to an endpoint got
its first byte (:meth:`note_success`; the gateway wires it to every breaker success). A run
of probe failures that are all *timeouts* (no answer within ``probe_timeout_s``) does not
make an endpoint unhealthy while real traffic to it succeeded within ``passive_window_s``: an
engine busy serving a flood on a starved CPU answers its requests and only misses the probes.
Such a status reads ``healthy`` with ``passive`` set and ``last_success`` saying why. Once the
window passes without a success (a hung engine answers nothing) the timeouts count as before,
at the next probe. A definite failure is never excused: a refused connection (the process is
gone), a dropped one, a non-200 ``/health`` or a failing ``/metrics`` in the run ejects the
endpoint after ``unhealthy_after`` as without traffic; failing real requests are the circuit
breaker's to count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from runtime.snapshot import EndpointSnap
from runtime.upstream.client import UpstreamClient
from runtime.upstream.errors import DeadlineExceeded, FirstByteTimeout, UpstreamError
from runtime.upstream.promtext import parse_samples

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"  # vLLM before 0.10
_GAUGES = (RUNNING, WAITING, KV_USAGE, KV_USAGE_LEGACY)

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HealthConfig:
    interval_s: float = 0.25
    health_every: int = 4  # /health once every this many /metrics scrapes
    unhealthy_after: int = 3
    probe_timeout_s: float = 1.0
    # Probe timeouts are excused while a real request succeeded this recently; 0 turns it off.
    passive_window_s: float = 5.0
    # The scrape period of an idle endpoint; None: the /health period (interval_s x
    # health_every); interval_s (or less): no idle mode.
    idle_interval_s: float | None = None

    @property
    def health_period_s(self) -> float:
        return self.interval_s * self.health_every

    @property
    def idle_period_s(self) -> float:
        """The scrape period while idle (never shorter than ``interval_s``)."""
        idle = self.health_period_s if self.idle_interval_s is None else self.idle_interval_s
        return max(idle, self.interval_s)

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.probe_timeout_s > 0):
            raise ValueError("interval_s and probe_timeout_s must be > 0")
        if self.health_every < 1 or self.unhealthy_after < 1:
            raise ValueError("health_every and unhealthy_after must be >= 1")
        if not self.passive_window_s >= 0:
            raise ValueError("passive_window_s must be >= 0")
        if self.idle_interval_s is not None and not self.idle_interval_s > 0:
            raise ValueError("idle_interval_s must be > 0")


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """What the last probes of one endpoint said. Times are the monitor's clock (the loop's by
    default); gauges None = unknown. ``passive``: healthy only because real traffic succeeded
    at ``last_success`` (as of the last probe) while the probes timed out."""

    endpoint_id: int
    base_url: str
    healthy: bool = False
    consecutive_failures: int = 0  # /metrics scrapes in a row that failed
    health_failures: int = 0  # /health checks in a row that failed
    metrics_timeouts: int = 0  # of consecutive_failures, those that got no answer in time
    health_timeouts: int = 0  # of health_failures, those that got no answer in time
    last_scrape: float | None = None  # last successful /metrics scrape
    last_health: float | None = None  # last successful /health check
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1, the fullest engine's
    last_error: str | None = None
    last_success: float | None = None  # last real request it answered (passive evidence)
    passive: bool = False


class HealthMonitor:
    """Watches a set of endpoints; ``start()`` in the lifespan, ``stop()`` at shutdown.

    ``clock`` stamps probes and noted successes (the running loop's time by default).
    """

    def __init__(
        self,
        client: UpstreamClient,
        config: HealthConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._client = client
        self.config = config or HealthConfig()
        self._clock = clock or _loop_time
        self._statuses: dict[int, EndpointStatus] = {}
        self._last_success: dict[int, float] = {}  # per watched endpoint, from note_success
        self._states: dict[int, str] = {}  # each watched endpoint's state in the snapshot
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._wakers: dict[int, asyncio.Event] = {}  # the idle endpoints' sleeps
        self._running = False

    def status(self, endpoint_id: int) -> EndpointStatus | None:
        return self._statuses.get(endpoint_id)

    def statuses(self) -> Mapping[int, EndpointStatus]:
        return dict(self._statuses)

    def note_success(self, endpoint_id: int) -> None:
        """A real request to this endpoint got its first byte now (ignored if not watched).

        On the request path: one clock read and one dict write; the status takes it in at
        the endpoint's next probe.
        """
        if endpoint_id in self._statuses:
            self._last_success[endpoint_id] = self._clock()
            waker = self._wakers.get(endpoint_id)
            if waker is not None:  # idle until now: scrape at once, then at interval_s
                waker.set()

    def last_success(self, endpoint_id: int) -> float | None:
        """When a real request to this endpoint last succeeded, if it is watched and one did."""
        return self._last_success.get(endpoint_id)

    def set_endpoints(self, endpoints: Iterable[EndpointSnap]) -> None:
        """Watch exactly these endpoints (those not ``gone``); call on every snapshot swap.

        An endpoint that turns ``ready`` is probed afresh at once: the failures seen while its
        engine was still starting are forgotten (until the new probe answers it counts as not
        yet probed), so a worker that just became ready is not refused for a probe interval.
        """
        wanted = {e.id: e for e in endpoints if e.state != "gone"}
        for endpoint_id in list(self._statuses):
            endpoint = wanted.get(endpoint_id)
            moved = endpoint is None or endpoint.base_url != self._statuses[endpoint_id].base_url
            became_ready = (
                endpoint is not None
                and endpoint.state == "ready"
                and self._states.get(endpoint_id) != "ready"
            )
            if moved or became_ready:
                self._forget(endpoint_id)
        for endpoint_id, endpoint in wanted.items():
            self._states[endpoint_id] = endpoint.state
            if endpoint_id not in self._statuses:
                self._statuses[endpoint_id] = EndpointStatus(
                    endpoint_id=endpoint_id, base_url=endpoint.base_url
                )
                if self._running:
                    self._spawn(endpoint_id)

    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        for endpoint_id in self._statuses:
            self._spawn(endpoint_id)

    async def stop(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def check_once(self, endpoint_id: int, *, health: bool = True) -> EndpointStatus:
        """Probe one endpoint now (``/metrics``, and ``/health`` if asked); the new status."""
        status = self._statuses[endpoint_id]
        if health:
            scraped, checked = await asyncio.gather(
                self._scrape(status), self._check_health(status)
            )
            status = _merge(scraped, checked)
        else:
            status = await self._scrape(status)
        status = self._judge(status, self._last_success.get(endpoint_id))
        current = self._statuses.get(endpoint_id)
        if current is not None and current.base_url == status.base_url:
            self._statuses[endpoint_id] = status  # unless forgotten or moved meanwhile
        return status

    def _judge(self, status: EndpointStatus, last_success: float | None) -> EndpointStatus:
        """Set ``healthy`` and ``passive`` from the failure runs and the passive evidence."""
        limit = self.config.unhealthy_after
        window = self.config.passive_window_s
        recent = window > 0 and last_success is not None and self._clock() - last_success <= window

        def holds(failures: int, timeouts: int) -> bool:
            return failures < limit or (recent and timeouts == failures)

        probed = status.last_scrape is not None and status.last_health is not None
        if probed:
            healthy = holds(status.consecutive_failures, status.metrics_timeouts) and holds(
                status.health_failures, status.health_timeouts
            )
        else:  # not yet answered both probes: usable until a definite failure or a full run
            healthy = (
                status.consecutive_failures == status.metrics_timeouts
                and status.health_failures == status.health_timeouts
                and status.consecutive_failures < limit
                and status.health_failures < limit
            )
        actively = status.consecutive_failures < limit and status.health_failures < limit
        return replace(
            status, healthy=healthy, passive=healthy and not actively, last_success=last_success
        )

    async def _scrape(self, status: EndpointStatus) -> EndpointStatus:
        try:
            code, body = await self._client.probe(
                status.base_url, "/metrics", timeout_s=self.config.probe_timeout_s
            )
        except UpstreamError as exc:
            return _metrics_failed(status, f"/metrics: {exc}", timed_out=_no_answer(exc))
        if code == 404:
            return replace(
                status, consecutive_failures=0, metrics_timeouts=0, last_scrape=self._clock()
            )
        if code != 200:
            return _metrics_failed(status, f"/metrics: HTTP {code}")
        samples = parse_samples(body.decode("utf-8", "replace"), _GAUGES)
        kv = samples.get(KV_USAGE) or samples.get(KV_USAGE_LEGACY)
        return replace(
            status,
            consecutive_failures=0,
            metrics_timeouts=0,
            last_scrape=self._clock(),
            running=sum(samples[RUNNING]) if RUNNING in samples else None,
            waiting=sum(samples[WAITING]) if WAITING in samples else None,
            kv_usage=max(kv) if kv else None,
        )

    async def _check_health(self, status: EndpointStatus) -> EndpointStatus:
        try:
            code, _ = await self._client.probe(
                status.base_url, "/health", timeout_s=self.config.probe_timeout_s
            )
        except UpstreamError as exc:
            if status.health_failures == 0 and str(exc).startswith("TLS"):  # once per run
                _log.warning("endpoint %s at %s: %s", status.endpoint_id, status.base_url, exc)
            return _health_failed(status, f"/health: {exc}", timed_out=_no_answer(exc))
        if code != 200:
            return _health_failed(status, f"/health: HTTP {code}")
        return replace(status, health_failures=0, health_timeouts=0, last_health=self._clock())

    async def _watch(self, endpoint_id: int) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        interval, idle_period = config.interval_s, config.idle_period_s
        health_period = config.health_period_s
        next_at = next_health = loop.time()
        noted: float | None = None  # the last first byte as of the previous scrape
        while endpoint_id in self._statuses:
            started = loop.time()
            health = started >= next_health - interval / 2  # float drift: due on its tick
            status: EndpointStatus | None = None
            try:
                status = await self.check_once(endpoint_id, health=health)
            except Exception:
                _log.exception("health check of endpoint %s failed unexpectedly", endpoint_id)
            if health:
                next_health = max(next_health + health_period, started)
            last_success, noted = noted, self._last_success.get(endpoint_id)
            idle = (
                idle_period > interval
                and status is not None
                and _idle(status)
                and last_success == noted  # no first byte since the scrape before
            )
            if not idle:
                next_at = max(next_at + interval, loop.time())  # overran: no catch-up burst
                await asyncio.sleep(next_at - loop.time())
                continue
            next_at = max(started + idle_period, loop.time())
            next_health = min(next_health, next_at)  # every idle scrape checks /health
            await self._sleep_idle(endpoint_id, next_at - loop.time())
            next_at = loop.time()

    async def _sleep_idle(self, endpoint_id: int, delay: float) -> None:
        """Sleep ``delay`` unless a real request's first byte (note_success) comes first."""
        waker = self._wakers[endpoint_id] = asyncio.Event()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await waker.wait()
        finally:
            if self._wakers.get(endpoint_id) is waker:
                del self._wakers[endpoint_id]

    def _spawn(self, endpoint_id: int) -> None:
        task = asyncio.get_running_loop().create_task(
            self._watch(endpoint_id), name=f"upstream-health-{endpoint_id}"
        )
        self._tasks[endpoint_id] = task

    def _forget(self, endpoint_id: int) -> None:
        del self._statuses[endpoint_id]
        self._states.pop(endpoint_id, None)
        self._last_success.pop(endpoint_id, None)
        self._wakers.pop(endpoint_id, None)
        task = self._tasks.pop(endpoint_id, None)
        if task is not None:
            task.cancel()


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _idle(status: EndpointStatus) -> bool:
    """Healthy with no failure pending and nothing running or waiting (or no gauges)."""
    return (
        status.healthy
        and not status.passive
        and status.consecutive_failures == 0
        and status.health_failures == 0
        and not status.running
        and not status.waiting
    )


def _no_answer(exc: UpstreamError) -> bool:
    """The probe timed out: no answer at all, unlike a refused or dropped connection."""
    return isinstance(exc, DeadlineExceeded | FirstByteTimeout) or isinstance(
        exc.__cause__, TimeoutError
    )


def _metrics_failed(
    status: EndpointStatus, error: str, *, timed_out: bool = False
) -> EndpointStatus:
    return replace(
        status,
        consecutive_failures=status.consecutive_failures + 1,
        metrics_timeouts=status.metrics_timeouts + int(timed_out),
        last_error=error,
    )


def _health_failed(
    status: EndpointStatus, error: str, *, timed_out: bool = False
) -> EndpointStatus:
    return replace(
        status,
        health_failures=status.health_failures + 1,
        health_timeouts=status.health_timeouts + int(timed_out),
        last_error=error,
    )


def _merge(scraped: EndpointStatus, checked: EndpointStatus) -> EndpointStatus:
    """Combine a scrape and a health check that both started from the same status."""
    return replace(
        scraped,
        health_failures=checked.health_failures,
        health_timeouts=checked.health_timeouts,
        last_health=checked.last_health,
        last_error=checked.last_error if checked.health_failures else scraped.last_error,
    )
