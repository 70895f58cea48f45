"""The settle script's calls for a batch of settlements (the layout: ``SETTLE_LUA`` in
:mod:`runtime.admission.scripts`).

A flush of the limits settler (:mod:`runtime.admission.redis_limits`) is one script call, not
one per settlement (issue #27: redis-py's packing and parsing per call was most of the
settler's CPU). A call carries at most :data:`SETTLES_PER_CALL` settlements, so a replay of
many goes in a few calls (one pipeline) and no one call holds Redis for long; a new call
starts where the budget period fields change (a batch across midnight UTC, a replay). The
first settlement of a call is laid out as the single-settlement script's keys and arguments;
each further one adds its done key and ``(block, lease, refund, drop, cost, event)``, where
``block`` numbers its tenant's keys in the call (a tenant's keys go once per call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from runtime.contract import done_key

if TYPE_CHECKING:
    from runtime.admission.redis_limits import Settlement

SETTLES_PER_CALL = 256  # one call per flush up to the settler's flush size (256)
DONE_TTL_S = 3600  # how long a settlement's done mark keeps a replay from applying twice

Call = tuple[list[str], list[Any]]


def settle_calls(
    batch: Sequence[Settlement], keys_of: Callable[[str], list[str]], stream: str, prefix: str
) -> list[Call]:
    """The settle script's calls (keys, args) for ``batch``, in order; ``keys_of(tenant)`` is
    a tenant's limit keys, ``stream`` the usage stream, ``prefix`` the done keys' namespace."""
    calls: list[Call] = []
    keys: list[str] = []
    args: list[Any] = []
    dones: list[str] = []
    blocks: dict[str, int] = {}  # tenant -> its keys' block in this call
    tenant_keys: list[str] = []  # the blocks after the first
    period = ("", "")
    for item in batch:
        done = done_key(prefix, item.tenant, item.lease)
        drop = "1" if item.drop_rpm else "0"
        if not args or len(dones) >= SETTLES_PER_CALL or (item.day, item.month) != period:
            if args:
                calls.append(([*keys, *dones, *tenant_keys], args))
            keys = [*keys_of(item.tenant), stream]
            args = [item.lease, item.refund, drop, item.cost_uc, item.day, item.month,
                    item.event, DONE_TTL_S]  # fmt: skip
            dones, blocks, tenant_keys = [done], {item.tenant: 1}, []
            period = (item.day, item.month)
            continue
        block = blocks.get(item.tenant)
        if block is None:
            block = blocks[item.tenant] = len(blocks) + 1
            tenant_keys += keys_of(item.tenant)
        dones.append(done)
        args += (block, item.lease, item.refund, drop, item.cost_uc, item.event)
    if args:
        calls.append(([*keys, *dones, *tenant_keys], args))
    return calls
