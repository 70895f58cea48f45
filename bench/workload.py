"""The open-loop schedule of one phase: who sends what, and when, decided from the seed alone.

Each tenant is an independent Poisson process whose rate steps up by ``burst_factor`` for
``burst_length_s`` out of every ``burst_every_s`` (normalised so the mean rate is the stated
one). The schedule does not depend on any response, and the same phase of the same scenario
gives every target exactly the same requests.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from bench.scenario import ArrivalSpec, PhaseSpec, Scenario, TenantSpec

_FILLER = "the quick brown fox jumps over a lazy dog while seven bright stars watch "


@dataclass(frozen=True, slots=True)
class Planned:
    """One request to send at ``at`` seconds after the phase starts."""

    index: int
    at: float
    tenant: str
    klass: str
    prompt_tokens: int
    max_tokens: int
    stream: bool


@dataclass(frozen=True, slots=True)
class PhasePlan:
    phase: str
    duration_s: float
    offered_rps: float  # mean rate the schedule was drawn from
    load_factor: float  # offered_rps / estimated backend capacity
    tenant_rps: dict[str, float]
    requests: tuple[Planned, ...]
    truncated: bool  # the request cap cut the schedule short


def tenant_rates(scenario: Scenario, phase: PhaseSpec) -> dict[str, float]:
    """Mean requests/s per tenant in ``phase``."""
    capacity = scenario.capacity_rps()
    base = phase.rate_rps if phase.rate_rps is not None else (phase.load_factor or 0) * capacity
    total_share = sum(t.rate_share for t in scenario.tenants)
    rates = {t.name: base * t.rate_share / total_share for t in scenario.tenants}
    if phase.flood_load_factor is not None:
        flooders = [t for t in scenario.tenants if t.flooding]
        extra = max(phase.flood_load_factor * capacity - base, 0.0)
        total = sum(t.rate_share for t in flooders)
        for tenant in flooders:
            share = tenant.rate_share / total if total > 0 else 1.0 / len(flooders)
            rates[tenant.name] += extra * share
    return rates


def _arrivals(rng: random.Random, rate: float, duration: float, spec: ArrivalSpec) -> list[float]:
    """Poisson arrival times in ``[0, duration)`` with periodic bursts (by thinning)."""
    if rate <= 0:
        return []
    period, length, factor = spec.burst_every_s, spec.burst_length_s, spec.burst_factor
    norm = (length * factor + (period - length)) / period
    low, high = rate / norm, rate * factor / norm
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(high)
        if t >= duration:
            return times
        current = high if (t % period) < length else low
        if rng.random() * high < current:
            times.append(t)


def _pick(rng: random.Random, mix: dict[str, float]) -> str:
    names = sorted(mix)
    return rng.choices(names, weights=[mix[n] for n in names])[0]


def _tenant_requests(
    scenario: Scenario, tenant: TenantSpec, phase: str, rate: float, duration: float
) -> list[tuple[float, str, str, int, int, bool]]:
    seed = zlib.crc32(f"{scenario.seed}:{phase}:{tenant.name}".encode())
    rng = random.Random(seed)
    return [
        (
            at,
            tenant.name,
            _pick(rng, tenant.classes),
            scenario.prompt.sample(rng),
            scenario.output.sample(rng),
            rng.random() < scenario.stream_share,
        )
        for at in _arrivals(rng, rate, duration, scenario.arrivals)
    ]


def plan_phase(
    scenario: Scenario, phase: PhaseSpec, *, duration_s: float, max_requests: int
) -> PhasePlan:
    """The deterministic schedule of ``phase`` lasting ``duration_s``, cut at ``max_requests``."""
    rates = tenant_rates(scenario, phase)
    drawn: list[tuple[float, str, str, int, int, bool]] = []
    for tenant in scenario.tenants:
        drawn.extend(_tenant_requests(scenario, tenant, phase.name, rates[tenant.name], duration_s))
    drawn.sort()
    truncated = len(drawn) > max_requests
    requests = tuple(
        Planned(index=i, at=at, tenant=t, klass=k, prompt_tokens=p, max_tokens=o, stream=s)
        for i, (at, t, k, p, o, s) in enumerate(drawn[:max_requests])
    )
    offered = sum(rates.values())
    return PhasePlan(
        phase=phase.name,
        duration_s=duration_s,
        offered_rps=offered,
        load_factor=offered / scenario.capacity_rps(),
        tenant_rps=rates,
        requests=requests,
        truncated=truncated,
    )


def prompt_text(planned: Planned) -> str:
    """A prompt of ``prompt_tokens`` tokens (4 characters each, as the simulator counts).

    It opens with the request's index so no two prompts are equal (no cache can answer it).
    """
    size = planned.prompt_tokens * 4
    head = f"r{planned.index} "
    body = _FILLER * (size // len(_FILLER) + 1)
    return (head + body)[:size] if size > len(head) else head[:size]
