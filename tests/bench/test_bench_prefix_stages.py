"""The prefix routing micro-bench runs the real stages and the placer and reports each figure."""

from __future__ import annotations

import pytest

from bench.prefix_stages import main, measure

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
