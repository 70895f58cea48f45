"""The budget period fields a settlement carries, computed once per UTC day."""

from __future__ import annotations

import calendar

import pytest

from runtime.admission import redis_limits
from runtime.admission.redis_limits import RedisLimits
from runtime.contract import period_fields

pytestmark = pytest.mark.unit


def test_the_fields_follow_the_clock_across_a_day_and_a_month(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = RedisLimits("redis://127.0.0.1:1/0")
    midnight = float(calendar.timegm((2026, 12, 1, 0, 0, 0)))  # November ends
    for now in (midnight - 3600.0, midnight - 0.001, midnight, midnight + 86_399.5,
                midnight + 86_400.0):  # fmt: skip
        monkeypatch.setattr(redis_limits.time, "time", lambda now=now: now)
        assert limits._period_fields() == period_fields(now), now
