""" "Sticky until saturated": when the longest cached prefix wins over load, as a pure function.

Given, per eligible endpoint, the request's cached prefix there (tokens, from the
:class:`~runtime.routing.prefix.PrefixMatch`), the uncached prefill already queued there
(tokens the engine must still prefill for requests sent to it that have no first token yet)
and its in-flight count and capacity, :func:`sticky_choice` names the endpoint to use, or
``None`` to mean "route by load" (the pool's usual scorers).

The rule, with an engine's TTFT modelled as its queued prefill plus the request's own uncached
prefill, both at the same prefill rate (so the rate cancels out)::

    best  = the endpoint with the longest cached prefix (ties: the least queued prefill,
            then the least in flight)
    light = the endpoint with the least queued prefill (ties: the longest cached prefix,
            then the least in flight)
    saved = cached(best) - cached(light)                  # tokens the cache saves at best
    extra = queued(best) - queued(light)                  # tokens it waits for at best
    chosen = best   if saved >= min_saved_tokens and extra <= saved * stickiness + slack_tokens
           = light  if saved <  min_saved_tokens and cached(light) >= min_saved_tokens
           = none   otherwise
    use chosen unless none or in_flight(chosen) >= capacity(chosen) * max_load

otherwise route by load. The second line keeps a prefix that several endpoints hold (a system
prompt the fleet has replicated) on the lightest of them: routing by load over all endpoints
would often pick one that must prefill it again.

- ``min_saved_tokens`` (default 64, one router block): a smaller saving is noise: no reason to
  prefer ``best`` over ``light``.
- ``stickiness`` (default 2.0): how much queued prefill one cached token is worth. 1.0 is the
  break-even for this request's TTFT alone (stick while its TTFT at ``best`` is no worse than
  at ``light``); but a prefill that is not chunked stretches the step of every sequence in
  the batch, so a token not prefilled also saves the others' time, and an uncached prefill
  placed at ``light`` is paid again by the next turn of the same conversation. In
  ``python -m bench.dispatch_sim --scenario bench/scenarios/prefix.toml --size full
  --routing prefix --sticky stickiness=X`` (4 engines), at 24 requests/s (load-only
  routing's knee) the share of requests within the 500 ms TTFT SLO is 0.67 at 0.5, 0.75 at
  1.0, 0.98 at 2.0 and 0.97 at 4.0 (load-only: 0.45); TTFT p50 212 / 113 / 81 / 82 ms
  (load-only: 636 ms).
- ``slack_tokens`` (default 0): queued prefill tolerated at ``best`` even without a saving edge.
- ``max_load`` (default 1.0): the chosen endpoint is saturated at ``in_flight >= capacity *
  max_load``
  whatever its cache holds (its decode batch is full: a new request would queue for a slot).

**Holding for the cached endpoint.** The rule only ever sees endpoints with room; when the one
holding the request's prefix is full (its batch slots all taken), "route by load" would send
the request to one that must prefill the whole prefix, a long step that stalls that engine's
batch and its newcomers, which at the knee starts a cascade: more uncached prefill, longer
steps, more requests in flight, more endpoints full. :func:`prefix_hold` instead keeps such a
request waiting in the router's queue (other tenants' requests pass it; its own tenant's later
ones stay behind it, as the queue keeps each tenant's order) for a slot on a full endpoint
that holds at least ``hold_min_tokens`` more of its prefix than any endpoint with room, for
at most ``hold_ms`` from the first moment an endpoint had room for it (below capacity, its
arrival); after that it goes wherever there is room.

**Sticky while saturated.** Past capacity every endpoint is full and the router's queue
grows: a request waits seconds before any endpoint has room for it, so a hold counted from
its arrival would never apply, and each request would take whichever endpoint freed a slot,
prefilling its whole history there, exactly when spilling gains nothing (every endpoint is
busy). Counted from when an endpoint first has room for it
(:meth:`~runtime.routing.prefix_placer.PrefixPlacer.room` remembers that moment per
request), it still holds for its prefix's endpoint while other tenants' requests take the
freed slot. In virtual time (the report's section "2026-11-27 (c): past capacity") this
raises goodput at 32 requests/s (4 engines, full size) from 1.38x load-only's to 2.20x and
at 24 from 1.84x to 2.15x; but a held request also holds its own tenant's later ones (the
queue keeps each tenant's order), so past capacity the backlog moves onto the tenants whose
heads hold most: the largest tenant's TTFT p50 rose on 2 schedules of 4 at 32 requests/s.

A slot frees every few tens of milliseconds on a saturated engine, much less than a prefill
of thousands of tokens takes on the engines it was tuned on (5,000 prefill tokens/s,
unchunked); a pool of engines that prefill such a prefix in a few tens of milliseconds
should lower ``hold_ms``.

- ``hold_ms`` (default 250; 0 turns holding off): in ``python -m bench.prefix_diagnose
  --seeds 35,1,2,3,4,5,6,7,8,9,10,11 [--policy prefix_hold_ms=500]`` (virtual time, 12
  schedules of ``bench/scenarios/prefix.toml``, 20 s phases) the share within the 500 ms TTFT
  SLO at 24 requests/s (load-only routing's knee) averages 0.76 without holding and 0.92 at
  250 ms, no schedule worse; 0.86 at 500 ms (10 schedules worse than at 250 ms, 1 better); at
  32 requests/s 0.29 / 0.37 / 0.46. 8 and 16 requests/s are unchanged (0.998 and 0.995).
  (With the hold's clock from arrival, before 2026-11-27 (c): 0.86 at 250 ms at 24 requests/s,
  0.89 at 500 ms; the performance report's section "2026-11-27 (c): past capacity".)
- ``hold_min_tokens`` (default 512): a smaller difference is not worth a wait.

Per pool, the pool policies :data:`STICKY_POLICY_KEYS` set these parameters
(``prefix_stickiness: "4"``); :meth:`StickyRule.from_policies` reads them for the ``prefix``
stage, keeping a parameter's default where its value is bad (the control plane refuses bad
values where they are written: :func:`sticky_policy_errors`).

llm-d's precise prefix-cache scorer reaches the same behaviour with weighted scorers (prefix
and queue/KV-use load); this states it as one inequality whose terms the router can measure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final

# Pool policy key -> the StickyRule parameter it sets.
STICKY_POLICY_KEYS: Final = {
    "prefix_min_saved_tokens": "min_saved_tokens",
    "prefix_stickiness": "stickiness",
    "prefix_slack_tokens": "slack_tokens",
    "prefix_max_load": "max_load",
    "prefix_hold_ms": "hold_ms",
    "prefix_hold_min_tokens": "hold_min_tokens",
}


@dataclass(frozen=True, slots=True)
class StickyRule:
    min_saved_tokens: int = 64
    stickiness: float = 2.0
    slack_tokens: int = 0
    max_load: float = 1.0
    hold_ms: float = 250.0
    hold_min_tokens: int = 512

    def __post_init__(self) -> None:
        if self.min_saved_tokens < 1:
            raise ValueError("min_saved_tokens must be >= 1")
        if not self.stickiness >= 0:
            raise ValueError("stickiness must be >= 0")
        if self.slack_tokens < 0:
            raise ValueError("slack_tokens must be >= 0")
        if not self.max_load > 0:
            raise ValueError("max_load must be > 0")
        if not self.hold_ms >= 0:
            raise ValueError("hold_ms must be >= 0")
        if self.hold_min_tokens < 1:
            raise ValueError("hold_min_tokens must be >= 1")

    @classmethod
    def from_policies(cls, policies: Mapping[str, str], *, strict: bool = False) -> StickyRule:
        """The rule a pool's policies set (:data:`STICKY_POLICY_KEYS`); a parameter whose
        value is bad keeps its default, or raises ``ValueError`` with ``strict``."""
        values: dict[str, Any] = {}
        for key, name in STICKY_POLICY_KEYS.items():
            raw = policies.get(key)
            if raw is None:
                continue
            one: dict[str, Any] = {}
            try:
                one[name] = _number(name, raw)
                cls(**one)  # validates this parameter alone
            except ValueError as exc:
                if strict:
                    raise ValueError(f"{key}: {exc}") from None
                continue
            values.update(one)
        return cls(**values)


_INTEGERS: Final = frozenset(f.name for f in fields(StickyRule) if f.type in (int, "int"))


def _number(name: str, raw: str) -> float:
    text = raw.strip()
    try:
        return int(text) if name in _INTEGERS else float(text)
    except ValueError:
        kind = "an integer" if name in _INTEGERS else "a number"
        raise ValueError(f"{name} must be {kind}, got {raw!r}") from None


def sticky_policy_errors(policies: Mapping[str, str]) -> list[str]:
    """What is wrong with a pool's sticky-rule policies (empty: the router uses them)."""
    errors: list[str] = []
    for key in STICKY_POLICY_KEYS:
        if key in policies:
            try:
                StickyRule.from_policies({key: policies[key]}, strict=True)
            except ValueError as exc:
                errors.append(f"{exc}.")
    return errors


@dataclass(frozen=True, slots=True)
class Candidate:
    """One eligible endpoint as the rule sees it."""

    endpoint_id: int
    cached_tokens: int  # the request's prefix the endpoint is believed to hold
    queued_prefill_tokens: int  # uncached prefill sent there and not yet started
    in_flight: int
    capacity: int


def sticky_choice(candidates: Sequence[Candidate], rule: StickyRule) -> int | None:
    """The endpoint id to stick to, or None to route by load (see the module's rule)."""
    if len(candidates) == 0:
        return None
    best = max(candidates, key=lambda c: (c.cached_tokens, -c.queued_prefill_tokens, -c.in_flight))
    light = min(candidates, key=lambda c: (c.queued_prefill_tokens, -c.cached_tokens, c.in_flight))
    saved = best.cached_tokens - light.cached_tokens
    if saved < rule.min_saved_tokens:
        # The lightest endpoint holds about as long a prefix as any: keep the prefix there.
        chosen = light if light.cached_tokens >= rule.min_saved_tokens else None
    elif best.queued_prefill_tokens - light.queued_prefill_tokens <= (
        saved * rule.stickiness + rule.slack_tokens
    ):
        chosen = best
    else:
        chosen = None
    if chosen is None or chosen.in_flight >= max(chosen.capacity, 1) * rule.max_load:
        return None
    return chosen.endpoint_id


def prefix_hold(cached_full: int, cached_room: int, waited_s: float, rule: StickyRule) -> bool:
    """Whether a request keeps waiting for a full endpoint (see the module's hold): the most
    of its prefix a full endpoint holds (``cached_full`` tokens) beats the most any endpoint
    with room holds (``cached_room``) by ``hold_min_tokens``, and it has waited less than
    ``hold_ms``."""
    return waited_s * 1000.0 < rule.hold_ms and cached_full - cached_room >= rule.hold_min_tokens
