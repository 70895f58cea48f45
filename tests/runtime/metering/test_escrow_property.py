"""Property: any interleaving of admit / settle / cancel (and dead leases) conserves credits.

The admission and settle scripts run against real Redis, driven by a Hypothesis state
machine. After every step: ``initial = balance + spent`` (spent = what the usage events say
was charged), ``balance = available + escrow``, escrow equals the sum of the holds still
open, and neither the balance nor the available amount is ever negative.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from escrow_support import redis_url
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from runtime.admission.scripts import ADMIT_LUA, SETTLE_LUA
from runtime.admission.settle_calls import DONE_TTL_S
from runtime.contract import credit_key, done_key, escrow_key, period_fields

pytestmark = pytest.mark.integration

TENANT = "p"
DAY, MONTH = period_fields()


class EscrowMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
        self.prefix = f"switchyard:test:prop:{uuid.uuid4().hex[:10]}"
        self.stream = f"{self.prefix}:usage"
        self.admit = self.client.register_script(ADMIT_LUA)
        self.settle = self.client.register_script(SETTLE_LUA)
        self.initial = 0
        self.holds: dict[str, int] = {}

    def keys(self) -> list[str]:
        base = f"{self.prefix}:{{{TENANT}}}"
        return [f"{base}:rpm", f"{base}:tpm", f"{base}:conc",
                credit_key(self.prefix, TENANT), escrow_key(self.prefix, TENANT)]  # fmt: skip

    @initialize(balance=st.integers(min_value=0, max_value=5_000))
    def fund(self, balance: int) -> None:
        self.initial = balance
        self.client.hset(credit_key(self.prefix, TENANT), "balance", balance)

    @rule(
        target=leases,
        need=st.integers(min_value=0, max_value=2_000),
        overdraft=st.booleans(),
        cap=st.sampled_from([-1, 500, 3_000]),
        lease_ms=st.sampled_from([60_000, 1]),
    )
    def admit_one(self, need: int, overdraft: bool, cap: int, lease_ms: int) -> str:
        lease = uuid.uuid4().hex
        status, _retry, _detail, available, _room, hold, *_rates = self.admit(
            keys=self.keys(),
            args=[lease, 10**6, 10**9, 10**6, 1, lease_ms, 60_000, need, DAY, MONTH, cap, -1,
                  "1" if overdraft else "0"],
        )  # fmt: skip
        if status in (b"ok", b"overdraft"):
            assert int(hold) in (0, need)
            assert int(available) >= 0 or int(hold) == 0
            if int(hold):
                self.holds[lease] = int(hold)
        else:
            assert status in (b"credits", b"budget"), status
        return lease

    @rule(lease=consumes(leases), cost=st.integers(min_value=0, max_value=3_000))
    def settle_one(self, lease: str, cost: int) -> None:
        self._settle(lease, cost, served=True)

    @rule(lease=consumes(leases))
    def cancel_before_engine(self, lease: str) -> None:
        self._settle(lease, 0, served=False)

    @rule(lease=leases, cost=st.integers(min_value=0, max_value=3_000))
    def replay(self, lease: str, cost: int) -> None:
        """A second settle of the same lease (a spool replay) changes nothing."""
        done = done_key(self.prefix, TENANT, lease)
        if self.client.exists(done):
            before = self.client.hgetall(credit_key(self.prefix, TENANT))
            self._settle(lease, cost, served=True)
            assert self.client.hgetall(credit_key(self.prefix, TENANT)) == before

    def _settle(self, lease: str, cost: int, *, served: bool) -> None:
        keys = [*self.keys(), self.stream, done_key(self.prefix, TENANT, lease)]
        event = f'{{"id":"{lease}"}}' if served else ""
        self.settle(keys=keys, args=[lease, 0, "0" if served else "1", cost, DAY, MONTH, event,
                                     DONE_TTL_S])  # fmt: skip
        self.holds.pop(lease, None)

    @invariant()
    def conserved(self) -> None:
        state = {k.decode(): int(v) for k, v in
                 self.client.hgetall(credit_key(self.prefix, TENANT)).items()}  # fmt: skip
        balance, escrow = state.get("balance", 0), state.get("escrow", 0)
        spent = sum(int(fields[b"charged"]) for _id, fields in self.client.xrange(self.stream))
        assert balance + spent == self.initial
        assert balance >= 0
        assert escrow >= 0
        assert balance - escrow >= 0
        held = {k.decode(): int(v) for k, v in
                self.client.hgetall(escrow_key(self.prefix, TENANT)).items()}  # fmt: skip
        assert sum(held.values()) == escrow
        assert set(held) <= set(self.holds)  # expired leases may have been released already

    def teardown(self) -> None:
        keys = list(self.client.scan_iter(match=f"{self.prefix}:*"))
        if keys:
            self.client.delete(*keys)
        self.client.close()


EscrowMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_escrow_conserves_credits = EscrowMachine.TestCase
