"""The x-ratelimit-* headers: OpenAI's names, and its duration format (issue #33)."""

from __future__ import annotations

import pytest

from runtime.admission.limits import Quota, RateState
from runtime.gateway.ratelimit_headers import duration, ratelimit_headers

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0ms"), (0.0174, "17ms"), (0.9994, "999ms"), (1.0, "1s"), (6.5, "6.5s"),
     (49.2, "49.2s"), (60.0, "1m0s"), (90.25, "1m30.25s"), (600.0, "10m0s")],
)  # fmt: skip
def test_durations_read_like_openais(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_six_headers_from_the_admission_state() -> None:
    state = RateState.of(Quota(rpm=600, tpm=1200, concurrency=1), used=7, tokens=900.7,
                         requests_reset_s=60.0)  # fmt: skip
    assert dict(ratelimit_headers(state)) == {
        b"x-ratelimit-limit-requests": b"600",
        b"x-ratelimit-remaining-requests": b"593",
        b"x-ratelimit-reset-requests": b"1m0s",
        b"x-ratelimit-limit-tokens": b"1200",
        b"x-ratelimit-remaining-tokens": b"900",
        b"x-ratelimit-reset-tokens": b"14.965s",  # 299.3 tokens at 20 per second
    }


def test_a_bucket_in_debt_reports_nothing_left() -> None:
    state = RateState.of(Quota(rpm=1, tpm=100, concurrency=1), used=3, tokens=-50.0,
                         requests_reset_s=-1.0)  # fmt: skip
    assert (state.requests_left, state.tokens_left, state.requests_reset_s) == (0, 0, 0.0)
    assert state.tokens_reset_s == pytest.approx(90.0)
