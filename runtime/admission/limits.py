"""Per-tenant limits: what they are, what a refusal says, and the per-process fallback.

The three limits, as both implementations enforce them:

- **RPM** — a sliding 60-second window (a log of admission times): a request is admitted
  while fewer than ``rpm`` were admitted in the last 60 s. Exact (no boundary bursts), and
  ``Retry-After`` is when the oldest admission in the window leaves it.
- **TPM** — a token bucket of ``tpm`` tokens refilled continuously at ``tpm / 60`` per
  second. Admission debits ``prompt + max_tokens`` (the worst case); settlement credits back
  what the request did not use (or debits what the estimate missed). A request needing more
  than ``tpm`` tokens passes only with a full bucket (and leaves it in debt), so a limit
  smaller than one request slows the tenant down instead of locking it out.
- **Concurrency** — leases: at most ``max_concurrency`` requests admitted and not yet
  settled. In Redis every lease carries a TTL that its router renews while the request runs,
  so a crashed router's slots come back on their own.

A request that never reached an engine (refused by the queue, dropped from it, cancelled
there) is settled with ``served=False``: its RPM entry and its whole TPM debit are given back.
"""

from __future__ import annotations

import collections
import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.admission.credits import NO_ASK, CreditAsk

WINDOW_S = 60.0


class LimitKind(enum.StrEnum):
    RPM = "rpm"
    TPM = "tpm"
    CONCURRENCY = "concurrency"


@dataclass(frozen=True, slots=True)
class Quota:
    rpm: int
    tpm: int
    concurrency: int

    def __post_init__(self) -> None:
        if min(self.rpm, self.tpm, self.concurrency) < 1:
            raise ValueError(f"every limit must be >= 1, got {self}")

    def divided(self, replicas: int) -> Quota:
        """This quota's conservative per-process share (each limit // replicas, at least 1)."""
        return Quota(
            rpm=max(1, self.rpm // replicas),
            tpm=max(1, self.tpm // replicas),
            concurrency=max(1, self.concurrency // replicas),
        )


@dataclass(frozen=True, slots=True)
class RateState:
    """A tenant's RPM and TPM as its admission read them (the ``x-ratelimit-*`` headers):
    the limit, what is left after this request, and the seconds until each is back to full
    (the request window: until its newest admission leaves it; the token bucket: until it
    refilled)."""

    requests_limit: int
    requests_left: int
    requests_reset_s: float
    tokens_limit: int
    tokens_left: int
    tokens_reset_s: float

    @classmethod
    def of(cls, quota: Quota, *, used: int, tokens: float, requests_reset_s: float) -> RateState:
        """From ``used`` admissions in the window and ``tokens`` in the bucket."""
        refill_s = max(0.0, quota.tpm - tokens) * WINDOW_S / quota.tpm
        return cls(
            requests_limit=quota.rpm,
            requests_left=max(0, quota.rpm - used),
            requests_reset_s=max(0.0, requests_reset_s),
            tokens_limit=quota.tpm,
            tokens_left=max(0, math.floor(tokens)),
            tokens_reset_s=refill_s,
        )


class LimitExceededError(Exception):
    """A tenant limit refused the request: 429 with ``Retry-After`` (and the limits' state
    when the refusing side read it)."""

    def __init__(
        self, kind: LimitKind, retry_after_s: float, message: str, rates: RateState | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s
        self.rates = rates

    @property
    def retry_after_header(self) -> int:
        """Whole seconds, at least 1, at most one window."""
        if not math.isfinite(self.retry_after_s):
            return int(WINDOW_S)
        return min(int(WINDOW_S), max(1, math.ceil(self.retry_after_s)))


def refusal(
    kind: LimitKind, retry_after_s: float, quota: Quota, used: float,
    rates: RateState | None = None,
) -> LimitExceededError:  # fmt: skip
    if kind is LimitKind.RPM:
        message = f"Rate limit reached: {quota.rpm} requests per minute."
    elif kind is LimitKind.TPM:
        message = (
            f"Token rate limit reached: {quota.tpm} tokens per minute "
            f"({max(used, 0.0):.0f} available now)."
        )
    else:
        message = f"Concurrency limit reached: {quota.concurrency} requests at a time."
    return LimitExceededError(kind, retry_after_s, message, rates)


@dataclass(slots=True)
class Lease:
    """One admitted request's hold on its tenant's limits, until :meth:`settle`."""

    id: str
    tenant: str
    quota: Quota
    tokens: int  # debited from the TPM bucket at admission
    source: str  # "redis", "local" or "allowance": where it was admitted (and is settled)
    settled: bool = False
    ask: CreditAsk = NO_ASK  # the credit check it passed (see :mod:`.credits`)
    hold_uc: int = 0  # micro-credits held in escrow until settlement
    overdraft: bool = False  # admitted without escrow as best effort (overdraft to batch)
    slot: str = ""  # the allowance's concurrency slot it holds (see :mod:`.allowance`)
    rates: RateState | None = None  # the RPM/TPM state its admission read (the headers)


def settle_refund(lease: Lease, *, actual_tokens: int | None, served: bool) -> int:
    """Tokens to credit back to the bucket (negative: debit more) when ``lease`` settles."""
    if not served:
        return lease.tokens
    if actual_tokens is None:
        return 0  # usage unknown: the worst case stays debited
    return lease.tokens - actual_tokens


@dataclass(slots=True)
class _TenantState:
    admitted: collections.deque[float] = field(default_factory=collections.deque)
    tokens: float | None = None
    refilled_at: float = 0.0
    leases: set[str] = field(default_factory=set)


class LocalLimits:
    """The same limits kept in this process only, each divided by ``replicas`` (the number
    of routers assumed to share the traffic): the fallback while Redis is unreachable."""

    __slots__ = ("_clock", "_tenants", "replicas")

    def __init__(self, *, replicas: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        self.replicas = replicas
        self._clock = clock
        self._tenants: dict[str, _TenantState] = {}

    def acquire(self, lease_id: str, tenant: str, quota: Quota, *, tokens: int) -> Lease:
        """Admit or raise :class:`LimitExceededError` (checks all three, then debits)."""
        local = quota.divided(self.replicas)
        state = self._tenants.setdefault(tenant, _TenantState())
        now = self._clock()
        while state.admitted and state.admitted[0] <= now - WINDOW_S:
            state.admitted.popleft()
        rate = local.tpm / WINDOW_S
        available = local.tpm if state.tokens is None else state.tokens
        available = min(local.tpm, available + (now - state.refilled_at) * rate)

        def rates(used: int, left: float) -> RateState:
            newest = state.admitted[-1] + WINDOW_S - now if state.admitted else 0.0
            return RateState.of(local, used=used, tokens=left, requests_reset_s=newest)

        if len(state.admitted) >= local.rpm:
            raise refusal(LimitKind.RPM, state.admitted[0] + WINDOW_S - now, local, 0,
                          rates(len(state.admitted), available))  # fmt: skip
        need = min(tokens, local.tpm)
        if available < need:
            raise refusal(LimitKind.TPM, (need - available) / rate, local, available,
                          rates(len(state.admitted), available))  # fmt: skip
        if len(state.leases) >= local.concurrency:
            raise refusal(LimitKind.CONCURRENCY, 1.0, local, 0,
                          rates(len(state.admitted), available))  # fmt: skip
        state.admitted.append(now)
        state.tokens, state.refilled_at = available - tokens, now
        state.leases.add(lease_id)
        return Lease(id=lease_id, tenant=tenant, quota=quota, tokens=tokens, source="local",
                     rates=rates(len(state.admitted), available - tokens))  # fmt: skip

    def settle(self, lease: Lease, *, actual_tokens: int | None, served: bool) -> None:
        state = self._tenants.get(lease.tenant)
        if state is None:
            return
        state.leases.discard(lease.id)
        if not served and state.admitted:
            state.admitted.pop()  # give the RPM entry back (the newest: close enough)
        refund = settle_refund(lease, actual_tokens=actual_tokens, served=served)
        if state.tokens is not None:
            state.tokens += refund

    def held(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return 0 if state is None else len(state.leases)
