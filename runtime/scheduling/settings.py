"""A pool's scheduling settings, read from its snapshot ``policies`` and the request classes.

Pool policy keys (all optional; values are strings, as in ``PoolSnap.policies``):

- ``fairness`` (``vtc``), ``ordering`` (``edf``), ``saturation`` (``vllm_metrics``): the
  implementations by name (:mod:`.registry`);
- ``headroom``: the fraction of each endpoint kept for tenants below their share
  (:mod:`.headroom`); default 0.25 with a fairness policy that isolates tenants, else 0;
- ``max_queue``: requests queued in the whole pool (default: the largest class
  ``max_queue_length``); at the bound the most sheddable request gives way — shadow, then
  lower ``shed_order`` (batch before standard before interactive), then over-quota;
- ``band_shares``: ``"band:share,..."`` guaranteed minimum shares (:mod:`.shares`); default
  0.05 for every band below the most urgent;
- ``preemption``: the victim choice (:mod:`.preempt`: ``fair``, ``fewest_generated``) of
  work-conserving isolation: the flood limit lends idle slots and takes them back by
  preempting a running stream (:mod:`.takeback`); ``off`` (the default) lends nothing;
- ``lend_reserve``: lend only while more than this many of the pool's slots are free
  (default 0);
- ``resume_first`` (``on``/``off``, default ``off``): a preempted request waits again in
  the most urgent band, ahead of its tenant's other requests, so it takes the next slot its
  tenant gets (:mod:`.takeback`);
- ``pace_prefill_tps``: with lending, a lent slot goes to an endpoint only once the
  prefills sent there are estimated done at this many prompt tokens per second (about
  half an engine's prefill rate measured best; 0, the default: no pacing, :mod:`.pacing`);
- ``resume_affinity`` (``on``/``off``, default ``off``): a preempted request resumes on the
  endpoint it ran on, whose prefix cache still holds its prompt and generated text
  (:mod:`.resume_home`); ``resume_hold_ms`` (default 0): how long after its preemption it
  waits for that endpoint when it is full before it resumes elsewhere;
- ``lend_max_prefill`` (tokens, default 0: no bound), ``lend_exclusive`` and ``lend_steer``
  (``on``/``off``, default ``off``): which prompts a lent slot takes, what it waits for, and
  where the others go (:mod:`.lent_prefill`).

Per band, the queue bound is the largest ``max_queue_length`` of the classes in that band;
bands no class names use ``default_limit``. Unparseable values are refused with
:class:`SettingsError` (the caller logs and falls back to the defaults).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from runtime.scheduling.lent_prefill import LentPrefillRule
from runtime.scheduling.queue import PoolQueue
from runtime.scheduling.registry import DEFAULTS, PoolPolicies
from runtime.scheduling.resume_home import ResumeHomeRule
from runtime.snapshot import RequestClassSnap

DEFAULT_HEADROOM = 0.25
DEFAULT_BAND_SHARE = 0.05
MAX_DEFAULT_SHARES = 0.5


class SettingsError(ValueError):
    """A pool policy value the scheduler cannot use."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSettings:
    fairness: str = DEFAULTS["fairness"]
    ordering: str = DEFAULTS["ordering"]
    saturation: str = DEFAULTS["saturation"]
    headroom: float | None = None  # None: DEFAULT_HEADROOM if the fairness policy isolates
    band_limits: Mapping[int, int] = field(default_factory=dict)
    default_limit: int | None = 1000
    max_total: int | None = None
    band_shares: Mapping[int, float] = field(default_factory=dict)
    preemption: str = "off"
    lend_reserve: int = 0
    resume_first: bool = False
    pace_prefill_tps: float = 0.0
    resume_affinity: bool = False
    resume_hold_ms: float = 0.0
    lend_max_prefill: int = 0
    lend_exclusive: bool = False
    lend_steer: bool = False

    def headroom_for(self, *, isolating: bool) -> float:
        if self.headroom is not None:
            return self.headroom
        return DEFAULT_HEADROOM if isolating else 0.0

    def resume_home(self) -> ResumeHomeRule:
        """The resume affinity rule (:mod:`.resume_home`) these settings ask for."""
        return ResumeHomeRule(affinity=self.resume_affinity, hold_s=self.resume_hold_ms / 1000)

    def lent_prefill(self) -> LentPrefillRule:
        """The lent-prefill rules (:mod:`.lent_prefill`) these settings ask for."""
        return LentPrefillRule(max_tokens=self.lend_max_prefill, exclusive=self.lend_exclusive,
                               steer=self.lend_steer)  # fmt: skip

    def policies(self) -> PoolPolicies:
        """The named implementations (``UnknownPolicyError`` for a name not registered)."""
        return PoolPolicies.from_policies(
            {"fairness": self.fairness, "ordering": self.ordering,
             "saturation": self.saturation, "preemption": self.preemption}
        )  # fmt: skip

    def new_queue(self, policies: PoolPolicies) -> PoolQueue:
        return PoolQueue(
            fairness=policies.fairness,
            ordering=policies.ordering,
            band_min_shares=self.band_shares,
            max_len_per_band=self.band_limits,
            default_max_len=self.default_limit,
            max_total=self.max_total,
        )

    def queue_key(self) -> tuple[object, ...]:
        """What the queue is built from: a change here rebuilds it."""
        return (
            self.fairness,
            self.ordering,
            tuple(sorted(self.band_limits.items())),
            self.default_limit,
            self.max_total,
            tuple(sorted(self.band_shares.items())),
        )

    @classmethod
    def from_policies(
        cls,
        policies: Mapping[str, str],
        classes: Iterable[RequestClassSnap],
        *,
        default_limit: int | None = 1000,
    ) -> PoolSettings:
        """Settings for a pool from its policies and the snapshot's classes."""
        limits: dict[int, int] = {}
        for klass in classes:
            if klass.max_queue_length > 0:
                limits[klass.priority_band] = max(
                    limits.get(klass.priority_band, 0), klass.max_queue_length
                )
        max_total = _positive_int(policies, "max_queue")
        if max_total is None and limits:
            max_total = max(limits.values())
        return cls(
            fairness=policies.get("fairness", DEFAULTS["fairness"]).strip(),
            ordering=policies.get("ordering", DEFAULTS["ordering"]).strip(),
            saturation=policies.get("saturation", DEFAULTS["saturation"]).strip(),
            headroom=_fraction(policies, "headroom"),
            band_limits=limits,
            default_limit=default_limit,
            max_total=max_total,
            band_shares=_band_shares(policies.get("band_shares"), sorted(limits)),
            preemption=policies.get("preemption", "off").strip(),
            lend_reserve=_count(policies, "lend_reserve"),
            resume_first=_switch(policies, "resume_first"),
            pace_prefill_tps=_rate(policies, "pace_prefill_tps"),
            resume_affinity=_switch(policies, "resume_affinity"),
            resume_hold_ms=_rate(policies, "resume_hold_ms"),
            lend_max_prefill=_count(policies, "lend_max_prefill"),
            lend_exclusive=_switch(policies, "lend_exclusive"),
            lend_steer=_switch(policies, "lend_steer"),
        )


def _parsed(policies: Mapping[str, str], key: str, kind: type[float], what: str) -> float | None:
    """``policies[key]`` read by ``kind`` (None when absent or blank); refused when not."""
    raw = policies.get(key)
    if raw is None or not raw.strip():
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"pool policy {key!r} must be {what}, got {raw!r}") from None
    if not math.isfinite(value):
        raise SettingsError(f"pool policy {key!r} must be finite, got {raw!r}")
    return value


def _within(value: float, key: str, ok: bool, bound: str) -> None:
    if not ok:
        raise SettingsError(f"pool policy {key!r} must be {bound}, got {value!r}")


def _positive_int(policies: Mapping[str, str], key: str) -> int | None:
    value = _parsed(policies, key, int, "an integer")
    if value is not None:
        _within(value, key, value >= 1, ">= 1")
    return None if value is None else int(value)


def _count(policies: Mapping[str, str], key: str) -> int:
    value = _parsed(policies, key, int, "an integer") or 0
    _within(value, key, value >= 0, ">= 0")
    return int(value)


def _rate(policies: Mapping[str, str], key: str) -> float:
    value = _parsed(policies, key, float, "a number") or 0.0
    _within(value, key, value >= 0, ">= 0")
    return value


def _fraction(policies: Mapping[str, str], key: str) -> float | None:
    value = _parsed(policies, key, float, "a number")
    if value is not None:
        _within(value, key, 0 <= value < 1, "in [0, 1)")
    return value


def _switch(policies: Mapping[str, str], key: str) -> bool:
    raw = (policies.get(key) or "off").strip()
    if raw not in ("on", "off"):
        raise SettingsError(f"pool policy {key!r} must be 'on' or 'off', got {raw!r}")
    return raw == "on"


def _band_shares(raw: str | None, bands: list[int]) -> dict[int, float]:
    if raw is None:
        shares: dict[int, float] = {}
        for band in bands[1:]:
            if sum(shares.values()) + DEFAULT_BAND_SHARE > MAX_DEFAULT_SHARES:
                break
            shares[band] = DEFAULT_BAND_SHARE
        return shares
    out: dict[int, float] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        number, sep, share = item.partition(":")
        try:
            band, value = int(number), float(share) if sep else math.nan
        except ValueError:
            raise SettingsError(f"bad band_shares entry {item!r} (want band:share)") from None
        out[band] = value
        if not (math.isfinite(value) and 0 <= value < 1):
            raise SettingsError(f"bad band_shares entry {item!r}: share must be in [0, 1)")
    if sum(out.values()) >= 1:
        raise SettingsError("band_shares must add up to less than 1")
    return out
