"""The prefix routing micro-bench runs the real stages and the placer and reports each figure."""

from __future__ import annotations

import asyncio

import pytest

from bench.prefix_stages import dispatch_us, main, measure, measure_all

pytestmark = pytest.mark.unit


def test_the_prefix_bench_measures_the_stages_and_the_placer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = measure(iterations=50)
    assert set(figures) == {"stage_off_us", "stage_on_us", "placer_us", "started_us", "blocks"}
    assert figures["blocks"] == 15
    assert all(value >= 0 for value in figures.values())
    main(["--iterations", "20", "--endpoints", "2"])
    assert "prefix stage, pool policy off" in capsys.readouterr().out


def test_the_prefix_bench_measures_a_short_unique_prompt_and_the_dispatch_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = measure_all(iterations=50, short=True)
    assert figures["blocks"] == 1  # the latency scenario's prompt: one block, matching nothing
    assert figures["release_us"] >= 0
    assert figures["release_off_us"] >= 0
    assert asyncio.run(dispatch_us(40, prefix=True)) > 0
    main(["--iterations", "20", "--endpoints", "2", "--dispatch", "40"])
    out = capsys.readouterr().out
    assert "270-character unique prompt (1 blocks)" in out
    assert "a unique one-block prefix" in out
