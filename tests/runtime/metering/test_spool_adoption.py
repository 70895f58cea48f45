"""A live router process adopts the spool slot of one that went away with settlements Redis
never got (real Redis; the dead one's Redis address refuses), and applies them exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from escrow_support import QUOTA, Bank, ask
from fixtures.wait import async_eventually
from test_escrow import closed_port, event

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_a_live_process_adopts_and_applies_a_gone_processs_spool(
    bank: Bank, tmp_path: Path
) -> None:
    bank.fund("t", 1_000)
    spool = tmp_path / "usage-spool"
    live = bank.limits(spool_dir=spool, adopt_every_s=0.05)
    await live.start()
    lease = await live.acquire("t", QUOTA, tokens=1, ask=ask(500))
    # A second worker of the same router, cut off from Redis: its settlement waits in its slot.
    gone = bank.limits(f"redis://127.0.0.1:{closed_port()}/0", spool_dir=spool, timeout_s=0.2)
    await gone.start()
    gone.settle(lease, actual_tokens=1, served=True, cost_uc=300, event=event(lease.id))
    assert await gone.flush() == 0
    assert (spool / "1" / "lock").exists()  # each process has a slot of its own
    await gone.stop()  # gone for good (no restart claims its slot): the live one adopts it
    try:
        await async_eventually(
            lambda: bank.events() and not list(spool.rglob("segment-*.jsonl")), timeout=10,
            what="the adopted settlement applied and its segment discarded",
        )  # fmt: skip
        assert len(bank.events()) == 1
        assert bank.balance("t") == 700
        assert bank.escrow("t") == 0
        assert not any((spool / "1").glob("*.jsonl"))  # moved, not copied
    finally:
        await live.stop()
    again = bank.limits(spool_dir=spool)  # a restart finds nothing left to replay
    await again.start()
    await again.flush()
    await again.stop()
    assert len(bank.events()) == 1
    assert bank.balance("t") == 700
