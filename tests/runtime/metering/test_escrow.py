"""Credit escrow in the admission script: hold the worst case, settle the actual, release the
rest, refuse with what is needed and available; budgets; overdraft; a crashed router's escrow;
the usage event appended in the same step as the charge; spool replay after Redis was down."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from escrow_support import QUOTA, Bank, ask
from fixtures.wait import async_eventually

from runtime.admission.credits import CreditKind, CreditRefusedError
from runtime.admission.limits import LimitExceededError, Quota
from runtime.metering.events import UsageEvent, decode_event, encode_event

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def event(lease_id: str, tenant: str = "t") -> bytes:
    return encode_event(
        UsageEvent(
            id=lease_id, tenant=tenant, api_key="k", version=1, endpoint=1, tier="cpu",
            request_class="standard", tokens_in=10, tokens_out=5, cost_uc=0, cached=False,
            outcome="ok", occurred_at=1.0,
        )
    )  # fmt: skip


async def test_escrow_holds_the_worst_case_and_settlement_charges_the_actual(bank: Bank) -> None:
    bank.fund("t", 1_000)
    limits = bank.limits()
    await limits.start()
    lease = await limits.acquire("t", QUOTA, tokens=10, ask=ask(600))
    assert lease.hold_uc == 600
    assert bank.escrow("t") == 600
    assert bank.holds("t") == {lease.id: 600}
    limits.settle(lease, actual_tokens=8, served=True, cost_uc=250, event=event(lease.id))
    assert await limits.flush() == 1
    assert bank.state("t")["balance"] == 750
    assert bank.escrow("t") == 0
    assert bank.holds("t") == {}
    [entry] = bank.events()
    assert int(entry[b"charged"]) == 250
    assert decode_event(entry[b"event"]).id == lease.id
    # the spend of the day and month is counted for budgets
    state = bank.state("t")
    assert sorted(v for k, v in state.items() if k.startswith(("day:", "month:"))) == [250, 250]


async def test_refusal_says_needed_and_available_and_changes_nothing(bank: Bank) -> None:
    bank.fund("t", 1_000)
    limits = bank.limits()
    await limits.start()
    held = await limits.acquire("t", QUOTA, tokens=1, ask=ask(700))
    before = bank.snapshot_keys()
    with pytest.raises(CreditRefusedError) as refused:
        await limits.acquire("t", QUOTA, tokens=1, ask=ask(301))
    assert refused.value.kind is CreditKind.CREDITS
    assert (refused.value.needed_uc, refused.value.available_uc) == (301, 300)
    assert "0.000301 credits" in str(refused.value)
    assert "0.000300 are available" in str(refused.value)
    assert bank.snapshot_keys() == before  # no RPM entry, no TPM debit, no lease, no escrow
    assert held.hold_uc == 700


async def test_a_tenant_never_funded_is_refused_but_free_requests_pass(bank: Bank) -> None:
    limits = bank.limits()
    await limits.start()
    with pytest.raises(CreditRefusedError) as refused:
        await limits.acquire("nobody", QUOTA, tokens=1, ask=ask(1))
    assert refused.value.available_uc == 0
    lease = await limits.acquire("nobody", QUOTA, tokens=1, ask=ask(0))
    assert lease.hold_uc == 0


async def test_unserved_request_costs_nothing_and_leaves_no_event(bank: Bank) -> None:
    bank.fund("t", 1_000)
    limits = bank.limits()
    await limits.start()
    lease = await limits.acquire("t", QUOTA, tokens=1, ask=ask(900))
    limits.settle(lease, actual_tokens=None, served=False, cost_uc=0, event=b"")
    await limits.flush()
    assert bank.balance("t") == 1_000
    assert bank.escrow("t") == 0
    assert bank.events() == []


async def test_a_charge_never_takes_the_balance_below_zero(bank: Bank) -> None:
    bank.fund("t", 100)
    limits = bank.limits()
    await limits.start()
    lease = await limits.acquire("t", QUOTA, tokens=1, ask=ask(100))
    limits.settle(lease, actual_tokens=5, served=True, cost_uc=500, event=event(lease.id))
    await limits.flush()
    assert bank.balance("t") == 0
    assert int(bank.events()[0][b"charged"]) == 100


async def test_budget_cap_counts_spend_and_escrow(bank: Bank) -> None:
    bank.fund("t", 10_000)
    limits = bank.limits()
    await limits.start()
    first = await limits.acquire("t", QUOTA, tokens=1, ask=ask(400, day_cap_uc=1_000))
    limits.settle(first, actual_tokens=1, served=True, cost_uc=400, event=event(first.id))
    await limits.flush()
    await limits.acquire("t", QUOTA, tokens=1, ask=ask(400, day_cap_uc=1_000))  # held: 400
    before = bank.snapshot_keys()
    with pytest.raises(CreditRefusedError) as refused:
        await limits.acquire("t", QUOTA, tokens=1, ask=ask(201, day_cap_uc=1_000))
    assert refused.value.kind is CreditKind.BUDGET
    assert refused.value.available_uc == 200
    assert bank.snapshot_keys() == before
    # the month cap applies the same way; no cap at all lets it through
    with pytest.raises(CreditRefusedError):
        await limits.acquire("t", QUOTA, tokens=1, ask=ask(201, month_cap_uc=1_000))
    assert (await limits.acquire("t", QUOTA, tokens=1, ask=ask(201))).hold_uc == 201


async def test_overdraft_to_batch_admits_without_escrow(bank: Bank) -> None:
    bank.fund("t", 50)
    limits = bank.limits()
    await limits.start()
    lease = await limits.acquire("t", QUOTA, tokens=1, ask=ask(100, overdraft_batch=True))
    assert lease.overdraft
    assert lease.hold_uc == 0
    assert bank.escrow("t") == 0
    limits.settle(lease, actual_tokens=1, served=True, cost_uc=80, event=event(lease.id))
    await limits.flush()
    assert bank.balance("t") == 0  # charged what the balance held, never below zero
    # a hard budget cap still refuses, overdraft or not
    with pytest.raises(CreditRefusedError):
        await limits.acquire("t", QUOTA, tokens=1, ask=ask(100, overdraft_batch=True,
                                                         day_cap_uc=10))  # fmt: skip


async def test_rate_limits_refuse_before_any_escrow(bank: Bank) -> None:
    bank.fund("t", 1_000)
    limits = bank.limits()
    await limits.start()
    narrow = Quota(rpm=1, tpm=1_000_000, concurrency=10)
    await limits.acquire("t", narrow, tokens=1, ask=ask(100))
    with pytest.raises(LimitExceededError):
        await limits.acquire("t", narrow, tokens=1, ask=ask(100))
    assert bank.escrow("t") == 100


async def test_escrow_of_a_crashed_router_comes_back_when_its_lease_expires(bank: Bank) -> None:
    bank.fund("t", 1_000)
    crashed = bank.limits(lease_ttl_s=0.2)
    await crashed.start()
    await crashed.acquire("t", QUOTA, tokens=1, ask=ask(1_000))
    crashed._active.clear()  # it dies: nobody renews or settles its lease
    await crashed.stop()
    survivor = bank.limits(lease_ttl_s=0.2)
    await survivor.start()
    with pytest.raises(CreditRefusedError):
        await survivor.acquire("t", QUOTA, tokens=1, ask=ask(1_000))

    async def admitted() -> bool:
        try:
            await survivor.acquire("t", QUOTA, tokens=1, ask=ask(1_000))
        except CreditRefusedError:
            return False
        return True

    await async_eventually(admitted, timeout=5, what="the dead lease's escrow to come back")
    assert bank.balance("t") == 1_000


async def test_settlement_is_spooled_and_replayed_once_after_redis_was_down(
    bank: Bank, tmp_path: Path
) -> None:
    bank.fund("t", 1_000)
    spool = tmp_path / "spool"
    up = bank.limits(spool_dir=spool)
    await up.start()
    lease = await up.acquire("t", QUOTA, tokens=1, ask=ask(500))
    await up.stop()
    # The same router, restarted while Redis is unreachable: the settlement waits on disk.
    down = bank.limits(f"redis://127.0.0.1:{closed_port()}/0", spool_dir=spool, timeout_s=0.2)
    await down.start()
    down.settle(lease, actual_tokens=1, served=True, cost_uc=300, event=event(lease.id))
    assert await down.flush() == 0
    await down.stop()
    assert any(spool.rglob("*.jsonl"))  # in the process's slot (spool/0/)
    # Two more restarts with Redis back: the first applies it, the second finds nothing new.
    for _ in range(2):
        again = bank.limits(spool_dir=spool)
        await again.start()
        await again.flush()
        await again.stop()
    assert bank.balance("t") == 700
    assert bank.escrow("t") == 0
    assert len(bank.events()) == 1
    assert not list(spool.rglob("segment-*.jsonl"))


async def test_a_settlement_replayed_twice_is_applied_once(bank: Bank, tmp_path: Path) -> None:
    bank.fund("t", 1_000)
    limits = bank.limits(spool_dir=tmp_path)
    await limits.start()
    lease = await limits.acquire("t", QUOTA, tokens=1, ask=ask(500))
    limits.settle(lease, actual_tokens=1, served=True, cost_uc=300, event=event(lease.id))
    await limits.flush()
    lease.settled = False  # the same settlement, queued again (as a replayed spool would)
    limits.settle(lease, actual_tokens=1, served=True, cost_uc=300, event=event(lease.id))
    await limits.flush()
    assert bank.balance("t") == 700
    assert len(bank.events()) == 1


async def test_local_fallback_lends_a_share_of_the_last_known_balance(bank: Bank) -> None:
    bank.fund("t", 1_000)
    limits = bank.limits(replicas=2, timeout_s=0.2)
    await limits.start()
    await limits.acquire("t", QUOTA, tokens=1, ask=ask(100))  # learns: 900 available

    async def gone(**_: object) -> None:  # Redis went away: every admission call is refused
        raise ConnectionRefusedError("Redis went away")

    limits._admit = gone
    local = await limits.acquire("t", QUOTA, tokens=1, ask=ask(400))
    assert local.source == "local"
    assert limits.degraded
    with pytest.raises(CreditRefusedError) as refused:
        await limits.acquire("t", QUOTA, tokens=1, ask=ask(100))
    assert refused.value.available_uc == 50  # 900 / 2 replicas - 400 already lent
    with pytest.raises(CreditRefusedError):  # a tenant never seen gets nothing
        await limits.acquire("other", QUOTA, tokens=1, ask=ask(1))
