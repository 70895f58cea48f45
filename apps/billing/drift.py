"""What the credit reconciliation found, kept in Redis for the control plane's ``/metrics``.

Each run of ``credit_reconcile`` records its time (Redis server time) and adds the drift it
repaired: the tenants whose Redis balance differed from the ledger (a missing balance, seeded
after a Redis restart, is not drift) and the sum of those differences in micro-credits. Hash
``{ns}:billing:reconcile``: ``last_run`` (unix seconds), ``repairs``, ``drift_uc`` (totals).
"""

from __future__ import annotations

from typing import Final

import msgspec
import redis

from apps.billing.ledger import Repair

_RECORD_LUA: Final = """
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'last_run', now[1] .. '.' .. string.format('%06d', now[2]))
redis.call('HINCRBY', KEYS[1], 'repairs', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'drift_uc', ARGV[2])
return 1
"""


class ReconcileTotals(msgspec.Struct, frozen=True):
    last_run: float | None  # unix seconds (Redis time); None: never ran
    repairs: int
    drift_uc: int


def reconcile_key(namespace: str) -> str:
    return f"{namespace}:billing:reconcile"


def reconcile_record(*, client: redis.Redis[bytes], namespace: str, repairs: list[Repair]) -> None:
    drifted = [r for r in repairs if r.redis_uc is not None]
    drift = sum(abs(r.expected_uc - (r.redis_uc or 0)) for r in drifted)
    client.eval(_RECORD_LUA, 1, reconcile_key(namespace), len(drifted), drift)  # type: ignore[no-untyped-call]


def reconcile_totals(*, client: redis.Redis[bytes], namespace: str) -> ReconcileTotals:
    raw = client.hgetall(reconcile_key(namespace))
    last = raw.get(b"last_run")
    return ReconcileTotals(
        last_run=None if last is None else float(last),
        repairs=int(raw.get(b"repairs", 0)),
        drift_uc=int(raw.get(b"drift_uc", 0)),
    )
