"""When admission leaves Redis for its local fallback, and when it comes back (issue #30).

One slow call is not an outage. :class:`Hysteresis` counts the failures of Redis calls and
decides, by this rule, when the fallback starts:

- a *connection* error (the client already retried it once on a fresh connection: nothing
  listens, Redis is stopped) enters the fallback at once;
- a *timeout* (or any other failure) enters it only after ``fail_after`` failures in a row, or
  when failures have gone on for ``fail_for_s`` with no call answering in between. A failure
  counts towards the run only if its call started after the run's previous counted failure,
  so the calls that one stall times out together count once.

Any answer from Redis (:meth:`Hysteresis.answered`) ends the run and the fallback. While on the
fallback, Redis is asked again ``retry_s`` after the last failure (:meth:`Hysteresis.may_ask`).
Entering and leaving the fallback are logged once each (WARNING); a failure that does not yet
enter it is logged at INFO. The owner (:class:`~.redis_limits.RedisLimits`) reports every call's
outcome; this module does no I/O.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError

logger = logging.getLogger(__name__)


def refused(exc: BaseException) -> bool:
    """A connection error: nothing was sent, or nothing listens."""
    return isinstance(exc, RedisConnectionError | ConnectionError)


class Hysteresis:
    """The run of failures and the fallback's state (see the module docstring). ``replicas``:
    the processes that share the limits, named in the fallback's log line."""

    def __init__(
        self,
        *,
        fail_after: int = 3,
        fail_for_s: float = 1.0,
        retry_s: float = 2.0,
        replicas: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fail_after < 1:
            raise ValueError("fail_after must be >= 1")
        self._fail_after = fail_after
        self._fail_for_s = fail_for_s
        self._retry_s = retry_s
        self._replicas = replicas
        self._clock = clock
        self._failures = 0  # the current run of failures
        self._failing_since = math.inf  # when the run's first failure came
        self._last_failure = -math.inf  # when its last counted failure came
        self._down_until = 0.0
        self._down = False

    @property
    def down(self) -> bool:
        """True while admission uses the local fallback."""
        return self._down

    @property
    def failures(self) -> int:
        """The failures counted in the current run (0 after an answer)."""
        return self._failures

    def may_ask(self) -> bool:
        """Whether Redis is to be asked now (always, unless on the fallback within
        ``retry_s`` of the last failure)."""
        return self._clock() >= self._down_until

    def failed(self, exc: BaseException, started: float | None = None) -> None:
        """A call that started at ``started`` (None: now) failed with ``exc``: count it
        towards the run and enter the fallback when the rule says so."""
        now = self._clock()
        if self._down:  # already on the fallback: Redis is asked again after retry_s
            self._down_until = now + self._retry_s
            return
        if started is None:
            started = now
        if self._failures == 0:
            self._failing_since = now
        if self._failures == 0 or started >= self._last_failure:
            self._failures += 1
            self._last_failure = now
        if not (
            refused(exc)
            or self._failures >= self._fail_after
            or now - self._failing_since >= self._fail_for_s
        ):
            logger.info(
                "limits: a Redis call failed (%r): failure %d of %d before the fallback",
                exc, self._failures, self._fail_after,
            )  # fmt: skip
            return
        self._down_until = now + self._retry_s
        self._down = True
        logger.warning(
            "limits: Redis unreachable (%r, %d failure(s) in a row); using per-process limits "
            "(each limit / %d assumed replicas: routers x workers) until it answers again",
            exc,
            self._failures,
            self._replicas,
        )

    def answered(self) -> None:
        """Redis answered a call: the run ends, and the fallback if it was on."""
        self._failures = 0
        self._failing_since = math.inf
        self._last_failure = -math.inf
        if self._down:
            self._down = False
            self._down_until = 0.0
            logger.warning("limits: Redis answers again; limits are global once more")
