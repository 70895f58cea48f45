"""bench.prefix_generated: the replay's indexes and the combinations a placer could use."""

from __future__ import annotations

import argparse

import pytest

from bench.prefix_generated import APPROXIMATE, COMBINED, main, replay

pytestmark = pytest.mark.unit


def _args(*extra: str) -> list[str]:
    return ["--requests", "400", "--capacity-blocks", "512", *extra]


def test_every_index_and_combination_is_tallied_on_every_request() -> None:
    parser_args = argparse.Namespace(
        answers="engine",
        tracker=None,
        requests=400,
        conversations=24,
        tenants=3,
        turns=6,
        running=4,
        capacity_blocks=512,
        seed=35,
        sized_factor=1.0,
        pressure_window=100,
    )
    tallies = replay(parser_args)
    assert set(tallies) == {"precise", *APPROXIMATE, *COMBINED}
    assert {t.requests for t in tallies.values()} == {400}
    assert len({t.held for t in tallies.values()}) == 1  # one engine, one truth
    # A max believes at least what each of its parts believes, request by request.
    for combined, parts in (
        ("max(p,approx)", ("precise", "approximate")),
        ("max(p,evicted)", ("precise", "approx-evicted")),
        ("max(p,sized)", ("precise", "approx-sized")),
    ):
        assert all(tallies[combined].claimed >= tallies[part].claimed for part in parts)
    # Under eviction the index bounded to the engine's capacity over-claims far less.
    assert tallies["approx-sized"].over < tallies["approximate"].over / 4


def test_main_prints_one_line_per_belief(capsys: pytest.CaptureFixture[str]) -> None:
    main(_args("--answers", "synthetic"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("answers synthetic")
    assert [line.split()[0] for line in lines[1:]] == ["precise", *APPROXIMATE, *COMBINED]
