"""The safety stages' micro-bench runs the real stages and reports every figure."""

from __future__ import annotations

import pytest

from bench.safety_stages import main, measure

pytestmark = pytest.mark.unit


def test_the_stage_bench_measures_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    figures = measure(iterations=50, tokens=20)
    assert set(figures) == {"prefilter_none_us", "postfilter_none_us", "prefilter_clean_us",
                            "prefilter_redact_us", "postfilter_setup_us", "screen_chunk_us",
                            "screen_stream_us"}  # fmt: skip
    assert all(value >= 0 for value in figures.values())
    # No pack attached is an early return: far cheaper than filtering.
    assert figures["prefilter_none_us"] < figures["prefilter_clean_us"]
    main(["--iterations", "20", "--tokens", "10"])
    assert "relay screen, per chunk" in capsys.readouterr().out
