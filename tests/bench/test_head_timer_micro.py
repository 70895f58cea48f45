"""bench.head_timer_micro drives the router's uvicorn protocol without sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.head_timer_micro import measure
from runtime.gateway import http_protocol

pytestmark = pytest.mark.unit


def test_it_times_this_checkouts_protocol_and_an_older_file() -> None:
    before = Path(http_protocol.__file__)  # the same file, loaded as the "older" one
    best = asyncio.run(measure(50, 1, str(before)))
    assert set(best) == {"this checkout", "before"}
    assert all(us > 0 for us in best.values())
