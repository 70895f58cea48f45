"""The simulator's ``--error-rate`` fault injection: a seeded share of generations answer 500."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from runtime.workers.simulator.__main__ import build_parser, config_from_args
from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.server import create_app
from runtime.workers.simulator.timing import TimingModel

pytestmark = [pytest.mark.integration]


async def statuses(error_rate: float, count: int) -> list[int]:
    config = SimulatorConfig(
        model="m", timing=TimingModel(prefill_tps=1e6, decode_a_ms=0.1, decode_b_ms=0),
        error_rate=error_rate, seed=3,
    )  # fmt: skip
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    payload = {"model": "m", "prompt": "hi", "max_tokens": 2}
    found: list[int] = []
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(count):
                async with http.post(f"http://127.0.0.1:{server.port}/v1/completions",
                                     json=payload) as resp:  # fmt: skip
                    body = await resp.json()
                    found.append(resp.status)
                    if resp.status == 500:
                        assert body["error"]["type"] == "InternalServerError"
    finally:
        await server.close()
    return found


@pytest.mark.asyncio
async def test_a_share_of_generations_fail_with_500() -> None:
    found = await statuses(0.5, 200)
    assert set(found) == {200, 500}
    assert 60 < found.count(500) < 140


@pytest.mark.asyncio
async def test_zero_and_one_are_exact() -> None:
    assert set(await statuses(0.0, 20)) == {200}
    assert set(await statuses(1.0, 20)) == {500}


def test_the_flag_and_its_validation() -> None:
    args = build_parser().parse_args(["--model", "m", "--error-rate", "0.25"])
    assert config_from_args(args).error_rate == 0.25
    with pytest.raises(ValueError, match="error_rate must be in"):
        SimulatorConfig(model="m", error_rate=1.5)
