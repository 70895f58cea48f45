"""Credits through real router processes and simulator engines: two routers never overspend
one balance together; a cancelled or broken stream is billed for what was generated; 402s
(credits, budget) change nothing; overdraft-to-batch serves best effort."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import msgspec
import pytest
import redis
from fixtures.router import Process, World, redis_url, routers, start_simulator, wait_ready
from fixtures.wait import eventually
from integration_support import tenant_limits

from runtime.contract import credit_key
from runtime.metering.events import decode_event
from runtime.snapshot import CreditSnap, PriceSnap, Snapshot

pytestmark = pytest.mark.integration

MODEL = "credits-chat"
# 1 credit per 1k input tokens and 2 per 1k output: 1000 and 2000 micro-credits a token.
PRICE = PriceSnap(version=1, hardware_tier="cpu", input_per_1k=1.0, output_per_1k=2.0,
                  cache_hit_discount=0.5)  # fmt: skip


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[Process]:
    """20 tokens take about a second: every admission happens before any request ends."""
    sim = start_simulator(MODEL, "--decode-a-ms", "50")
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def broken_engine() -> Iterator[Process]:
    sim = start_simulator(MODEL, "--decode-a-ms", "5", "--fail-after-tokens", "6")
    yield sim
    sim.stop()


class Priced(World):
    credits: dict[str, CreditSnap]

    def priced(self) -> Snapshot:
        return msgspec.structs.replace(
            self.snapshot(), prices=(PRICE,), credits=getattr(self, "credits", {})
        )


def world_for(engine: Process, **credits: CreditSnap) -> Priced:
    world = Priced()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, engine.base_url, pool="cpu", capacity=128)
    for tenant in ("payer", "broke", "capped", "batcher"):
        world.add_tenant(tenant, tenant_limits=tenant_limits())
        world.add_key(tenant, tenant)
    world.credits = credits
    return world


class Ledger:
    """The router-side state under the routers' namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())

    def fund(self, tenant: str, micro: int) -> None:
        self.client.hset(credit_key(f"{self.namespace}:limits", tenant), "balance", micro)

    def state(self, tenant: str) -> dict[str, int]:
        raw = self.client.hgetall(credit_key(f"{self.namespace}:limits", tenant))
        return {k.decode(): int(v) for k, v in raw.items()}

    def events(self) -> list[tuple[dict[str, object], int]]:
        out = []
        for _id, fields in self.client.xrange(f"{self.namespace}:usage"):
            event = msgspec.to_builtins(decode_event(fields[b"event"]))
            out.append((event, int(fields[b"charged"])))
        return out

    def close(self) -> None:
        self.client.close()


def chat(max_tokens: int = 20, **extra: object) -> dict[str, object]:
    messages = [{"role": "user", "content": "count to twenty please"}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, **extra}


def worst_case(base_url: str, key: str) -> int:
    """What escrow needs for ``chat()``: a tenant with nothing is told in the 402."""
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=chat(),
                        headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip
    assert answer.status_code == 402, answer.text
    error = answer.json()["error"]
    assert error["code"] == "insufficient_credits"
    assert error["type"] == "insufficient_quota"
    assert error["available_credits"] == "0.000000"
    return int(Decimal(error["needed_credits"]) * 1_000_000)


@pytest.mark.timing
def test_two_routers_never_overspend_one_balance(slow_engine: Process, tmp_path: Path) -> None:
    world = world_for(slow_engine)
    with routers(world, tmp_path, count=2) as (pair, publisher):
        version = publisher.publish(world.priced())
        for router in pair:
            wait_ready(router, version)
        ledger = Ledger(publisher.prefix)
        try:
            need = worst_case(pair[0].base_url, world.secrets["broke"])
            for round_ in range(3):
                _round(pair, world, ledger, need, round_)
        finally:
            ledger.close()


def _round(pair: list[Process], world: Priced, ledger: Ledger, need: int, round_: int) -> None:
    budget = 10 * need + need // 2  # covers ten worst cases, not eleven
    ledger.client.delete(credit_key(f"{ledger.namespace}:limits", "payer"))
    ledger.client.delete(f"{ledger.namespace}:usage")
    ledger.fund("payer", budget)
    headers = {"Authorization": f"Bearer {world.secrets['payer']}"}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, headers=headers) as http:
            return await asyncio.gather(*(
                http.post(f"{pair[i % 2].base_url}/v1/chat/completions", json=chat())
                for i in range(64)
            ))  # fmt: skip

    answers = asyncio.run(burst())
    statuses = [a.status_code for a in answers]
    ok = [a for a in answers if a.status_code == 200]
    assert len(ok) == 10, (round_, statuses)
    assert statuses.count(402) == 54, statuses
    for refused in (a for a in answers if a.status_code == 402):
        assert refused.json()["error"]["code"] == "insufficient_credits"
    events = eventually(lambda: len(ledger.events()) == 10 and ledger.events(), timeout=10,
                        what="ten usage events")  # fmt: skip
    state = eventually(lambda: ledger.state("payer").get("escrow") == 0 and ledger.state("payer"),
                       timeout=10, what="escrow released")  # fmt: skip
    charged = sum(c for _e, c in events)
    usage = [a.json()["usage"] for a in ok]
    expected = sum(u["prompt_tokens"] * 1000 + u["completion_tokens"] * 2000 for u in usage)
    assert charged == expected
    assert charged <= budget
    assert state["balance"] == budget - charged
    assert all(e["outcome"] == "ok" and e["tier"] == "cpu" for e, _c in events)
    assert len({e["id"] for e, _c in events}) == 10


def test_cancel_mid_stream_is_billed_for_the_tokens_generated(
    slow_engine: Process, tmp_path: Path
) -> None:
    world = world_for(slow_engine)
    with routers(world, tmp_path) as ([router], publisher):
        wait_ready(router, publisher.publish(world.priced()))
        ledger = Ledger(publisher.prefix)
        ledger.fund("payer", 10_000_000)
        headers = {"Authorization": f"Bearer {world.secrets['payer']}"}
        seen = 0
        url = f"{router.base_url}/v1/chat/completions"
        body = chat(max_tokens=200, stream=True)
        with (
            httpx.Client(timeout=30, headers=headers) as http,
            http.stream("POST", url, json=body) as answer,
        ):
            assert answer.status_code == 200
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    seen += 1  # the first chunk opens the message (role only, no token)
                if seen >= 6:
                    break
        [(event, charged)] = eventually(ledger.events, timeout=10, what="the usage event")
        assert event["outcome"] == "cancelled"
        assert 5 <= event["tokens_out"] < 200  # the client saw 5 tokens, then hung up
        assert charged == event["tokens_in"] * 1000 + event["tokens_out"] * 2000
        state = eventually(lambda: ledger.state("payer").get("escrow") == 0 and ledger.state(
            "payer"), timeout=10, what="escrow released")  # fmt: skip
        assert state["balance"] == 10_000_000 - charged
        ledger.close()


def test_a_broken_stream_is_billed_for_what_was_generated(
    broken_engine: Process, tmp_path: Path
) -> None:
    world = world_for(broken_engine)
    with routers(world, tmp_path) as ([router], publisher):
        wait_ready(router, publisher.publish(world.priced()))
        ledger = Ledger(publisher.prefix)
        ledger.fund("payer", 10_000_000)
        headers = {"Authorization": f"Bearer {world.secrets['payer']}"}
        answer = httpx.post(f"{router.base_url}/v1/chat/completions", headers=headers,
                            json=chat(max_tokens=50, stream=True), timeout=30)  # fmt: skip
        assert answer.status_code == 200
        assert '"error"' in answer.text
        [(event, charged)] = eventually(ledger.events, timeout=10, what="the usage event")
        assert event["outcome"] == "error"
        assert 1 <= event["tokens_out"] <= 6
        assert charged == event["tokens_in"] * 1000 + event["tokens_out"] * 2000
        ledger.close()


def test_402_refusals_change_nothing(slow_engine: Process, tmp_path: Path) -> None:
    world = world_for(slow_engine, capped=CreditSnap(day_cap=0.01))
    with routers(world, tmp_path) as ([router], publisher):
        wait_ready(router, publisher.publish(world.priced()))
        ledger = Ledger(publisher.prefix)
        ledger.fund("broke", 1)
        ledger.fund("capped", 10_000_000)
        before = {t: ledger.state(t) for t in ("broke", "capped")}
        keys_before = sorted(ledger.client.scan_iter(match=f"{publisher.prefix}:limits:*"))
        for tenant, code in (("broke", "insufficient_credits"), ("capped", "budget_exceeded")):
            answer = httpx.post(f"{router.base_url}/v1/chat/completions", json=chat(),
                                headers={"Authorization": f"Bearer {world.secrets[tenant]}"},
                                timeout=30)  # fmt: skip
            assert answer.status_code == 402
            error = answer.json()["error"]
            assert error["code"] == code
            assert set(error) >= {"message", "type", "param", "code", "needed_credits",
                                  "available_credits"}  # fmt: skip
            assert error["needed_credits"] in error["message"]
        assert {t: ledger.state(t) for t in ("broke", "capped")} == before
        assert sorted(ledger.client.scan_iter(match=f"{publisher.prefix}:limits:*")) == keys_before
        assert ledger.events() == []
        ledger.close()


def test_overdraft_to_batch_serves_best_effort_without_going_negative(
    slow_engine: Process, tmp_path: Path
) -> None:
    world = world_for(slow_engine, batcher=CreditSnap(overdraft="batch"))
    with routers(world, tmp_path) as ([router], publisher):
        wait_ready(router, publisher.publish(world.priced()))
        ledger = Ledger(publisher.prefix)
        ledger.fund("batcher", 5_000)  # less than one request's worst case
        answer = httpx.post(f"{router.base_url}/v1/chat/completions", json=chat(),
                            headers={"Authorization": f"Bearer {world.secrets['batcher']}"},
                            timeout=30)  # fmt: skip
        assert answer.status_code == 200, answer.text
        [(_event, charged)] = eventually(ledger.events, timeout=10, what="the usage event")
        assert charged == 5_000
        assert eventually(lambda: ledger.state("batcher").get("balance") == 0, timeout=10)
        ledger.close()
