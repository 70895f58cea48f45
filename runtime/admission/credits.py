"""Credit escrow at admission: what a request asks for, what a refusal says, the fallback.

The Redis side lives in the admission script (:mod:`.redis_limits`): with the rate limits
and the concurrency cap it checks, in the same atomic step,

- each hard budget cap of the tenant (credits charged this UTC day/month + everything held in
  escrow + this request's worst case must stay within the cap) -> 402 ``budget_exceeded``;
- the balance (``available = balance - escrow`` must cover the worst case)
  -> 402 ``insufficient_credits``, unless the tenant's overdraft setting is ``batch``: then
  the request is admitted with nothing held, at the lowest band, as best effort;

and, only if everything passes, holds the worst case in escrow under the request's lease id.
Settlement charges what was used (never more than it can pay: balances never go negative)
and releases the rest. The escrow of a crashed router's requests comes back when their
concurrency lease expires.

**Fallback while Redis is down** (:class:`LocalCredits`, the conservative rule): a router
lends a tenant at most ``1 / replicas`` of the available credits (and budget room) the last
Redis answer reported for it, minus what it already held or charged locally since; a tenant
it never heard about gets nothing (402) unless its request is free. Charges made meanwhile
wait in the spool and reach Redis and the ledger when it answers again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from runtime.metering.pricing import to_credits


class CreditKind(StrEnum):
    CREDITS = "insufficient_credits"
    BUDGET = "budget_exceeded"


@dataclass(frozen=True, slots=True, kw_only=True)
class CreditAsk:
    """One request's worst case, and the tenant's budget and overdraft settings."""

    need_uc: int
    day_field: str
    month_field: str
    day_cap_uc: int = -1  # -1: no cap
    month_cap_uc: int = -1
    overdraft_batch: bool = False

    @property
    def args(self) -> list[object]:
        return [self.need_uc, self.day_field, self.month_field, self.day_cap_uc,
                self.month_cap_uc, "1" if self.overdraft_batch else "0"]  # fmt: skip


NO_ASK = CreditAsk(need_uc=0, day_field="", month_field="")


class CreditRefusedError(Exception):
    """402: the balance or a hard budget cap does not cover the request's worst case."""

    def __init__(self, kind: CreditKind, *, needed_uc: int, available_uc: int) -> None:
        self.kind = kind
        self.needed_uc = needed_uc
        self.available_uc = max(0, available_uc)
        needed, available = to_credits(needed_uc), to_credits(self.available_uc)
        if kind is CreditKind.CREDITS:
            message = (
                f"Insufficient credits: this request may cost up to {needed} credits and "
                f"{available} are available."
            )
        else:
            message = (
                f"Budget exceeded: this request may cost up to {needed} credits and the "
                f"budget allows {available} more this period."
            )
        super().__init__(message)


@dataclass(slots=True)
class _Known:
    available_uc: int = 0  # last reported by Redis
    room_uc: int = -1  # budget room last reported (-1: no cap)
    used_uc: int = 0  # held or charged locally since Redis went away


@dataclass(slots=True)
class LocalCredits:
    """Per-process escrow while Redis is unreachable (the rule in the module docstring)."""

    replicas: int = 2
    _tenants: dict[str, _Known] = field(default_factory=dict)

    def learn(self, tenant: str, available_uc: int, room_uc: int) -> None:
        """Redis answered for ``tenant``: remember its balance and budget room."""
        known = self._tenants.setdefault(tenant, _Known())
        known.available_uc, known.room_uc, known.used_uc = available_uc, room_uc, 0

    def hold(self, tenant: str, ask: CreditAsk) -> tuple[int, bool]:
        """(µc held, overdraft) or raise :class:`CreditRefusedError`."""
        if ask.need_uc <= 0:
            return 0, False
        known = self._tenants.get(tenant, _Known())
        if known.room_uc >= 0:
            room = known.room_uc // self.replicas - known.used_uc
            if room < ask.need_uc:
                raise CreditRefusedError(
                    CreditKind.BUDGET, needed_uc=ask.need_uc, available_uc=room
                )
        share = known.available_uc // self.replicas - known.used_uc
        if share < ask.need_uc:
            if ask.overdraft_batch:
                return 0, True
            raise CreditRefusedError(CreditKind.CREDITS, needed_uc=ask.need_uc, available_uc=share)
        known.used_uc += ask.need_uc
        self._tenants[tenant] = known
        return ask.need_uc, False

    def unhold(self, tenant: str, held_uc: int) -> None:
        """Give back what :meth:`hold` took for a request refused after all (its limits)."""
        known = self._tenants.get(tenant)
        if known is not None and held_uc > 0:
            known.used_uc = max(0, known.used_uc - held_uc)
