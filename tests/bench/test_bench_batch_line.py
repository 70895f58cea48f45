"""The batch_line stage's micro-bench runs the real stage and reports every figure."""

from __future__ import annotations

import pytest

from bench.batch_line_micro import main, measure

pytestmark = pytest.mark.unit


def test_the_batch_line_bench_measures_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    figures = measure(iterations=200)
    assert set(figures) == {"unmarked_us", "marked_us", "forged_us"}
    assert all(value > 0 for value in figures.values())
    # No mark is an early return: cheaper than verifying one.
    assert figures["unmarked_us"] < figures["marked_us"]
    main(["--iterations", "50"])
    assert "batch line, mark verified" in capsys.readouterr().out
