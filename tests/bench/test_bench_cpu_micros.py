"""bench.placement_micro and bench.account_micro run and print a figure per item."""

from __future__ import annotations

import pytest

from bench import account_micro, placement_micro

pytestmark = pytest.mark.unit


@pytest.mark.asyncio
async def test_placement_micro_measures_the_fast_path() -> None:
    per_request = await placement_micro.measure(200, endpoints=2, window=8, repeats=1)
    assert 0 < per_request < 0.01


def test_account_micro_measures_each_item(capsys: pytest.CaptureFixture[str]) -> None:
    account_micro.main(["--iterations", "200", "--per-flush", "50"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "version_stats_us", "slis_us", "record_and_flush_us",
    ]  # fmt: skip
