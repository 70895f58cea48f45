"""Redis key names shared by the routers and the control plane (one place, so they agree).

Per tenant, under the limits prefix and the tenant's hash tag (same slot as its limits)::

    {prefix}:{<tenant>}:credit    hash: balance, escrow (µc), day:<YYYYMMDD>, month:<YYYYMM>
    {prefix}:{<tenant>}:escrow    hash: lease id -> µc held by that admitted request
    {prefix}:{<tenant>}:done:<id> set once a lease was settled (replays are no-ops), 1 h TTL

``available = balance - escrow``. ``balance`` is the ledger's balance minus the charges still
on their way to it (usage events not yet written); ``day:``/``month:`` are the credits charged
in that UTC period (for budgets). The usage stream is ``<namespace>:usage``.
"""

from __future__ import annotations

import time

USAGE_GROUP = "ledger"
"""The consumer group of the Celery consumer on the usage stream."""


def credit_key(prefix: str, tenant: str) -> str:
    return f"{prefix}:{{{tenant}}}:credit"


def escrow_key(prefix: str, tenant: str) -> str:
    return f"{prefix}:{{{tenant}}}:escrow"


def done_key(prefix: str, tenant: str, lease_id: str) -> str:
    return f"{prefix}:{{{tenant}}}:done:{lease_id}"


def usage_stream(namespace: str) -> str:
    return f"{namespace}:usage"


def ledger_lock(namespace: str) -> str:
    """Held by the ledger consumer, the reconciler and grants while they change balances."""
    return f"{namespace}:ledger-lock"


def period_fields(now: float | None = None) -> tuple[str, str]:
    """The budget fields of the UTC day and month containing ``now`` (unix seconds)."""
    t = time.gmtime(time.time() if now is None else now)
    return (
        f"day:{t.tm_year:04d}{t.tm_mon:02d}{t.tm_mday:02d}",
        f"month:{t.tm_year:04d}{t.tm_mon:02d}",
    )
