"""The open-loop schedule of one phase: who sends what, and when, decided from the seed alone.

Each tenant is an independent Poisson process whose rate steps up by ``burst_factor`` for
``burst_length_s`` out of every ``burst_every_s`` (normalised so the mean rate is the stated
one). The schedule does not depend on any response, and the same phase of the same scenario
gives every target exactly the same requests. A phase with ``arrivals_from``
(:class:`~bench.scenario.PhaseSpec`) replays the named phase's draw for every tenant whose
rate is the same in both (:func:`drawn_from`): its requests arrive at the same offsets with
the same classes, lengths and streaming, so a per-tenant figure of one phase over the other
compares the same traffic under another load.

Shared prefixes (a scenario's ``[prefix]`` table, :class:`~bench.scenario.PrefixSpec`): a
request that is not unique carries its tenant's system prompt and, as the next turn of one of
the tenant's live conversations, that conversation's history; :func:`chat_messages` renders
it with deterministic texts, so every turn of a conversation repeats the one before it
character for character and an engine's prefix cache (or a router's prefix index) can match
it. The assistant's answers in a history are synthetic (the open-loop client does not wait
for the real ones): what matters for a prefix cache is that the earlier turn's prompt is a
prefix of the next one.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass

from bench.scenario import ArrivalSpec, PhaseSpec, PrefixSpec, Scenario, TenantSpec

_FILLER = "the quick brown fox jumps over a lazy dog while seven bright stars watch "


@dataclass(frozen=True, slots=True)
class Planned:
    """One request to send at ``at`` seconds after the phase starts."""

    index: int
    at: float
    tenant: str
    klass: str
    prompt_tokens: int  # the whole prompt: system prompt + history + the new user message
    max_tokens: int
    stream: bool
    system_tokens: int = 0  # the tenant's shared system prompt (0: none)
    conversation: str = ""  # "" for a unique request
    history: tuple[tuple[int, int], ...] = ()  # earlier turns: (user tokens, answer tokens)

    @property
    def user_tokens(self) -> int:
        """The new user message's tokens."""
        return self.prompt_tokens - self.system_tokens - sum(u + a for u, a in self.history)


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


_Drawn = tuple[float, str, str, int, int, bool, int, str, tuple[tuple[int, int], ...]]


class _Conversations:
    """A tenant's live conversations in one phase: which one a request continues, and its turns."""

    def __init__(self, spec: PrefixSpec, tenant: TenantSpec, phase: str, max_len: int) -> None:
        self.spec = spec
        self.tenant = tenant
        self.phase = phase
        self.max_len = max_len
        self.started = 0
        self.live: list[tuple[str, list[tuple[int, int]]]] = []

    def next_turn(
        self, rng: random.Random, user: int, answer: int
    ) -> tuple[str, tuple[tuple[int, int], ...]]:
        slot = rng.randrange(self.spec.conversations)
        while len(self.live) <= slot:
            self.live.append(self._new())
        conv, turns = self.live[slot]
        used = self.tenant.system_prompt_tokens + sum(u + a for u, a in turns)
        if len(turns) >= self.spec.max_turns or used + user + answer > self.max_len:
            conv, turns = self.live[slot] = self._new()
        history = tuple(turns)
        turns.append((user, answer))
        return conv, history

    def _new(self) -> tuple[str, list[tuple[int, int]]]:
        self.started += 1
        return f"{self.tenant.name}/{self.phase}/c{self.started}", []


def drawn_from(scenario: Scenario, phase: PhaseSpec) -> dict[str, str]:
    """Per tenant, the phase whose seed draws its requests in ``phase``: the phase named by
    ``phase.arrivals_from`` for a tenant with the same rate in both (paired draws), else
    ``phase`` itself."""
    rates = tenant_rates(scenario, phase)
    if not phase.arrivals_from:
        return dict.fromkeys(rates, phase.name)
    source = scenario.phase(phase.arrivals_from)
    theirs = tenant_rates(scenario, source)
    return {
        name: source.name if math.isclose(rate, theirs[name], rel_tol=1e-9) else phase.name
        for name, rate in rates.items()
    }


def _tenant_requests(
    scenario: Scenario,
    tenant: TenantSpec,
    phase: str,
    rate: float,
    duration: float,
    *,
    seed_phase: str,
) -> list[_Drawn]:
    """``tenant``'s requests in ``phase``, drawn from ``seed_phase``'s seed (conversations
    are named after ``phase`` all the same, so two phases never share a prefix)."""
    seed = zlib.crc32(f"{scenario.seed}:{seed_phase}:{tenant.name}".encode())
    rng = random.Random(seed)
    prefix = scenario.prefix
    conversations = _Conversations(prefix, tenant, phase, scenario.backends.max_model_len)
    drawn: list[_Drawn] = []
    for at in _arrivals(rng, rate, duration, scenario.arrivals):
        klass = _pick(rng, tenant.classes)
        prompt = scenario.prompt.sample(rng)
        output = scenario.output.sample(rng)
        stream = rng.random() < scenario.stream_share
        system, conv = 0, ""
        history: tuple[tuple[int, int], ...] = ()
        if prefix.enabled and rng.random() >= prefix.unique_share:
            system = tenant.system_prompt_tokens
            conv, history = conversations.next_turn(rng, prompt, output)
        total = system + sum(u + a for u, a in history) + prompt
        drawn.append((at, tenant.name, klass, total, output, stream, system, conv, history))
    return drawn


def plan_phase(
    scenario: Scenario, phase: PhaseSpec, *, duration_s: float, max_requests: int
) -> PhasePlan:
    """The deterministic schedule of ``phase`` lasting ``duration_s``, cut at ``max_requests``."""
    rates = tenant_rates(scenario, phase)
    seeds = drawn_from(scenario, phase)
    drawn: list[_Drawn] = []
    for tenant in scenario.tenants:
        drawn.extend(_tenant_requests(scenario, tenant, phase.name, rates[tenant.name],
                                      duration_s, seed_phase=seeds[tenant.name]))  # fmt: skip
    drawn.sort(key=lambda d: (d[0], d[1]))
    truncated = len(drawn) > max_requests
    requests = tuple(
        Planned(
            index=i,
            at=at,
            tenant=t,
            klass=k,
            prompt_tokens=p,
            max_tokens=o,
            stream=s,
            system_tokens=sys_tokens,
            conversation=conv,
            history=history,
        )
        for i, (at, t, k, p, o, s, sys_tokens, conv, history) in enumerate(drawn[:max_requests])
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


def _text(head: str, tokens: int) -> str:
    """``tokens`` tokens of text (4 characters each, as the simulator counts) opening with
    ``head``."""
    size = tokens * 4
    body = _FILLER * (size // len(_FILLER) + 1)
    return (head + body)[:size] if size > len(head) else head[:size]


def prompt_text(planned: Planned) -> str:
    """The new user message: ``user_tokens`` tokens (the whole prompt of a unique request).

    It opens with the request's index (a conversation's turn: the conversation and the turn,
    as the next turn's history repeats it) so no two are equal.
    """
    if planned.conversation:
        return _user_text(planned.conversation, len(planned.history), planned.user_tokens)
    return _text(f"r{planned.index} ", planned.user_tokens)


def _user_text(conversation: str, turn: int, tokens: int) -> str:
    return _text(f"[{conversation} t{turn} user] ", tokens)


def system_text(tenant: str, tokens: int) -> str:
    """A tenant's system prompt: the same text for every request of the tenant."""
    return _text(f"[system prompt of {tenant}] ", tokens)


def chat_messages(planned: Planned) -> list[dict[str, str]]:
    """The request's chat messages: system prompt, the conversation's history, the new one."""
    messages: list[dict[str, str]] = []
    if planned.system_tokens:
        messages.append(
            {"role": "system", "content": system_text(planned.tenant, planned.system_tokens)}
        )
    for turn, (user, answer) in enumerate(planned.history):
        head = f"[{planned.conversation} t{turn} answer] "
        messages.append({"role": "user", "content": _user_text(planned.conversation, turn, user)})
        messages.append({"role": "assistant", "content": _text(head, answer)})
    messages.append({"role": "user", "content": prompt_text(planned)})
    return messages
