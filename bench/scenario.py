"""Declarative scenarios: a TOML file parsed into frozen, validated dataclasses.

A scenario says what the backends are, who sends what (tenants, request classes, lengths,
streaming share), how requests arrive (Poisson with bursts), and which phases (offered loads)
to run, with per-size durations. ``override`` sets one dotted path of the raw document before
parsing, which is how the experiment mode (``python -m bench sweep``) varies one parameter.
See ``bench/scenarios/*.toml`` for annotated examples.
"""

from __future__ import annotations

import copy
import math
import random
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIZES = ("smoke", "full")


class ScenarioError(ValueError):
    """The scenario file is missing something or holds a value the harness cannot use."""


def _get(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in table:
        raise ScenarioError(f"{where}: missing '{key}'")
    value = table[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ScenarioError(f"{where}.{key}: expected a number, got {value!r}")
    if not isinstance(value, kind):
        raise ScenarioError(f"{where}.{key}: expected {kind}, got {value!r}")
    return value


def _opt(table: Mapping[str, Any], key: str, default: Any, where: str) -> Any:
    if key not in table:
        return default
    kind: type | tuple[type, ...] = (int, float) if isinstance(default, float) else type(default)
    return _get(table, key, kind, where)


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Lognormal token counts, rounded and clipped to ``[low, high]``."""

    mu: float
    sigma: float
    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        return max(self.low, min(self.high, round(rng.lognormvariate(self.mu, self.sigma))))

    def mean(self, samples: int = 5_000, seed: int = 0) -> float:
        rng = random.Random(seed)
        return sum(self.sample(rng) for _ in range(samples)) / samples


@dataclass(frozen=True, slots=True)
class BackendSpec:
    kind: str  # "simulator" | "vllm"
    count: int
    model: str
    prefill_tps: float = 5000.0
    decode_a_ms: float = 10.0
    decode_b_ms: float = 0.5
    max_num_seqs: int = 64
    kv_capacity_tokens: int = 65536
    max_model_len: int = 4096
    model_path: str = ""  # vllm: the model directory
    extra_args: tuple[str, ...] = ()
    block_size: int = 16  # simulator: tokens per KV block (its prefix cache's unit)
    prefix_cache_blocks: int | None = None  # simulator: None = kv_capacity_tokens / block_size
    kv_events: bool = False  # backends publish KV events (ZeroMQ) for switchyard-precise

    def cache_blocks(self) -> int:
        """The simulator's prefix-cache capacity in blocks (0: caching off)."""
        if self.prefix_cache_blocks is None:
            return self.kv_capacity_tokens // self.block_size
        return self.prefix_cache_blocks


@dataclass(frozen=True, slots=True)
class ClassSpec:
    name: str
    priority_band: int
    ttft_slo_ms: float
    deadline_ms: int
    max_queue_length: int = 10_000
    shed_order: int = 0


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    weight: float
    rate_share: float  # of the phase's base rate
    classes: dict[str, float]  # class -> fraction of this tenant's requests
    flooding: bool = False
    system_prompt_tokens: int = 0  # shared by its requests that are not unique (see PrefixSpec)


@dataclass(frozen=True, slots=True)
class PrefixSpec:
    """Shared prompt prefixes (the ``[prefix]`` table; without it every prompt is unique).

    A request is *unique* with probability ``unique_share`` (no system prompt, no history, as
    without the table). Otherwise it is the next turn of one of its tenant's ``conversations``
    live conversations (picked uniformly): the tenant's system prompt
    (``tenants[].system_prompt_tokens``), the conversation's earlier turns (each user message
    and the assistant's answer, as long as that turn's output) and a new user message drawn from
    ``lengths.prompt``. After ``max_turns`` turns, or when the next turn would not fit in
    ``backends.max_model_len``, the conversation is replaced by a new one.
    """

    unique_share: float = 1.0
    conversations: int = 8
    max_turns: int = 1

    @property
    def enabled(self) -> bool:
        return self.unique_share < 1.0


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    burst_factor: float = 1.0  # rate multiplier inside a burst (1 = plain Poisson)
    burst_every_s: float = 10.0
    burst_length_s: float = 1.0


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """One offered load. Exactly one of ``rate_rps`` and ``load_factor`` (x capacity).

    ``arrivals_from`` (a phase's name, "" for none) pairs this phase with that one: every
    tenant whose rate here equals its rate there draws its requests from that phase's seed
    (the same arrival times, classes, lengths and streaming), so a figure of this phase over
    that one compares one draw with itself; a tenant whose rate differs (a flooder) draws its
    own. See :func:`bench.workload.plan_phase`.
    """

    name: str
    rate_rps: float | None = None
    load_factor: float | None = None
    flood_load_factor: float | None = None  # flooding tenants raise the total to this
    arrivals_from: str = ""


@dataclass(frozen=True, slots=True)
class SizeSpec:
    phase_duration_s: float
    drain_timeout_s: float
    request_timeout_s: float
    max_requests_per_phase: int
    warmup_requests: int = 10
    phases: tuple[str, ...] = ()  # empty: every phase


@dataclass(frozen=True, slots=True)
class SwitchyardSpec:
    policies: dict[str, str] = field(default_factory=dict)
    log_level: str = "warning"
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportSpec:
    slo_class: str = ""  # the class whose SLO attainment is the headline
    baseline_phase: str = ""  # contention: the no-flood phase ...
    flood_phase: str = ""  # ... and the flood phase compared with it
    added_p99_budget_ms: float = 10.0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    seed: int
    backends: BackendSpec
    classes: dict[str, ClassSpec]
    tenants: tuple[TenantSpec, ...]
    arrivals: ArrivalSpec
    prompt: LengthDist
    output: LengthDist
    stream_share: float
    prefix: PrefixSpec
    phases: tuple[PhaseSpec, ...]
    sizes: dict[str, SizeSpec]
    switchyard: SwitchyardSpec
    report: ReportSpec
    targets: tuple[str, ...]
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    def size(self, name: str) -> SizeSpec:
        if name not in self.sizes:
            raise ScenarioError(f"scenario '{self.name}' has no size '{name}'")
        return self.sizes[name]

    def phase(self, name: str) -> PhaseSpec:
        """The phase called ``name``."""
        for phase in self.phases:
            if phase.name == name:
                return phase
        raise ScenarioError(f"scenario '{self.name}' has no phase '{name}'")

    def phases_for(self, size: str) -> tuple[PhaseSpec, ...]:
        wanted = self.size(size).phases
        return tuple(p for p in self.phases if not wanted or p.name in wanted)

    def capacity_rps(self) -> float:
        """Requests/s the backends sustain, estimated from the simulator's timing model."""
        b = self.backends
        prompt, output = self.prompt.mean(seed=self.seed), self.output.mean(seed=self.seed + 1)
        batch = max(1.0, min(b.max_num_seqs, b.kv_capacity_tokens / (prompt + output)))
        step_s = (b.decode_a_ms + b.decode_b_ms * batch) / 1000.0
        per_request_s = output * step_s / batch + prompt / b.prefill_tps
        return b.count / per_request_s


def _length(table: Mapping[str, Any], where: str) -> LengthDist:
    dist = LengthDist(
        mu=float(_get(table, "mu", (int, float), where)),
        sigma=float(_get(table, "sigma", (int, float), where)),
        low=_get(table, "min", int, where),
        high=_get(table, "max", int, where),
    )
    if not (dist.sigma >= 0 and 1 <= dist.low <= dist.high):
        raise ScenarioError(f"{where}: need sigma >= 0 and 1 <= min <= max")
    return dist


def _size(table: Mapping[str, Any], where: str) -> SizeSpec:
    size = SizeSpec(
        phase_duration_s=float(_get(table, "phase_duration_s", (int, float), where)),
        drain_timeout_s=float(_opt(table, "drain_timeout_s", 5.0, where)),
        request_timeout_s=float(_opt(table, "request_timeout_s", 30.0, where)),
        max_requests_per_phase=int(_opt(table, "max_requests_per_phase", 20_000, where)),
        warmup_requests=int(_opt(table, "warmup_requests", 10, where)),
        phases=tuple(_opt(table, "phases", [], where)),
    )
    if not (size.phase_duration_s > 0 and size.request_timeout_s > 0):
        raise ScenarioError(f"{where}: durations must be > 0")
    if size.max_requests_per_phase < 1:
        raise ScenarioError(f"{where}: max_requests_per_phase must be >= 1")
    return size


def _phase(table: Mapping[str, Any], where: str) -> PhaseSpec:
    rate = table.get("rate_rps")
    factor = table.get("load_factor")
    if (rate is None) == (factor is None):
        raise ScenarioError(f"{where}: give exactly one of rate_rps and load_factor")
    flood = table.get("flood_load_factor")
    phase = PhaseSpec(
        name=_get(table, "name", str, where),
        rate_rps=None if rate is None else float(rate),
        load_factor=None if factor is None else float(factor),
        flood_load_factor=None if flood is None else float(flood),
        arrivals_from=str(_opt(table, "arrivals_from", "", where)),
    )
    if not ((phase.rate_rps or 0) > 0 or (phase.load_factor or 0) > 0):
        raise ScenarioError(f"{where}: the rate must be > 0")
    return phase


def _check_pairing(phases: tuple[PhaseSpec, ...]) -> None:
    """Each ``arrivals_from`` names another phase, one that draws its own arrivals."""
    own = {p.name: p for p in phases}
    for i, phase in enumerate(phases):
        source = phase.arrivals_from
        if not source:
            continue
        where = f"phases[{i}].arrivals_from"
        if source not in own:
            raise ScenarioError(f"{where}: no phase named '{source}' (phases: {sorted(own)})")
        if source == phase.name or own[source].arrivals_from:
            raise ScenarioError(f"{where}: '{source}' must be another phase drawing its own")


def _tenant(table: Mapping[str, Any], classes: Mapping[str, ClassSpec], where: str) -> TenantSpec:
    mix = _get(table, "classes", dict, where)
    unknown = sorted(set(mix) - set(classes))
    if unknown or not mix:
        raise ScenarioError(f"{where}.classes: unknown or no classes: {unknown}")
    tenant = TenantSpec(
        name=_get(table, "name", str, where),
        weight=float(_opt(table, "weight", 1.0, where)),
        rate_share=float(_get(table, "rate_share", (int, float), where)),
        classes={k: float(v) for k, v in mix.items()},
        flooding=bool(_opt(table, "flooding", False, where)),
        system_prompt_tokens=int(_opt(table, "system_prompt_tokens", 0, where)),
    )
    if tenant.weight <= 0 or tenant.rate_share < 0 or sum(tenant.classes.values()) <= 0:
        raise ScenarioError(f"{where}: weight must be > 0, rate_share >= 0, a class mix > 0")
    if tenant.system_prompt_tokens < 0:
        raise ScenarioError(f"{where}: system_prompt_tokens must be >= 0")
    return tenant


def _prefix(table: Mapping[str, Any], where: str = "prefix") -> PrefixSpec:
    if not table:
        return PrefixSpec()
    spec = PrefixSpec(
        unique_share=float(_get(table, "unique_share", (int, float), where)),
        conversations=int(_opt(table, "conversations", 8, where)),
        max_turns=int(_opt(table, "max_turns", 1, where)),
    )
    if not 0 <= spec.unique_share <= 1:
        raise ScenarioError(f"{where}.unique_share must be in [0, 1]")
    if spec.conversations < 1 or spec.max_turns < 1:
        raise ScenarioError(f"{where}: conversations and max_turns must be >= 1")
    return spec


def parse(doc: Mapping[str, Any]) -> Scenario:
    """A validated scenario from a parsed TOML document."""
    classes = {}
    for i, c in enumerate(_get(doc, "classes", list, "scenario")):
        where = f"classes[{i}]"
        spec = ClassSpec(
            name=_get(c, "name", str, where),
            priority_band=int(_opt(c, "priority_band", 0, where)),
            ttft_slo_ms=float(_get(c, "ttft_slo_ms", (int, float), where)),
            deadline_ms=int(_opt(c, "deadline_ms", 60_000, where)),
            max_queue_length=int(_opt(c, "max_queue_length", 10_000, where)),
            shed_order=int(_opt(c, "shed_order", 0, where)),
        )
        classes[spec.name] = spec
    tenants = tuple(
        _tenant(t, classes, f"tenants[{i}]")
        for i, t in enumerate(_get(doc, "tenants", list, "scenario"))
    )
    if not tenants or sum(t.rate_share for t in tenants) <= 0:
        raise ScenarioError("scenario: need tenants with a positive total rate_share")
    b = _get(doc, "backends", dict, "scenario")
    backends = BackendSpec(
        kind=str(_opt(b, "kind", "simulator", "backends")),
        count=int(_get(b, "count", int, "backends")),
        model=str(_opt(b, "model", "sim-model", "backends")),
        prefill_tps=float(_opt(b, "prefill_tps", 5000.0, "backends")),
        decode_a_ms=float(_opt(b, "decode_a_ms", 10.0, "backends")),
        decode_b_ms=float(_opt(b, "decode_b_ms", 0.5, "backends")),
        max_num_seqs=int(_opt(b, "max_num_seqs", 64, "backends")),
        kv_capacity_tokens=int(_opt(b, "kv_capacity_tokens", 65536, "backends")),
        max_model_len=int(_opt(b, "max_model_len", 4096, "backends")),
        model_path=str(_opt(b, "model_path", "", "backends")),
        extra_args=tuple(_opt(b, "extra_args", [], "backends")),
        block_size=int(_opt(b, "block_size", 16, "backends")),
        kv_events=bool(_opt(b, "kv_events", False, "backends")),
        prefix_cache_blocks=(
            None
            if b.get("prefix_cache_blocks") is None
            else int(_get(b, "prefix_cache_blocks", int, "backends"))
        ),
    )
    if backends.block_size < 1 or (backends.prefix_cache_blocks or 0) < 0:
        raise ScenarioError("backends: block_size must be >= 1, prefix_cache_blocks >= 0")
    if backends.kind not in ("simulator", "vllm") or backends.count < 1:
        raise ScenarioError("backends: kind must be simulator|vllm and count >= 1")
    if backends.kind == "vllm" and not backends.model_path:
        raise ScenarioError("backends: kind = 'vllm' needs model_path")
    a = doc.get("arrivals", {})
    arrivals = ArrivalSpec(
        burst_factor=float(_opt(a, "burst_factor", 1.0, "arrivals")),
        burst_every_s=float(_opt(a, "burst_every_s", 10.0, "arrivals")),
        burst_length_s=float(_opt(a, "burst_length_s", 1.0, "arrivals")),
    )
    if arrivals.burst_factor < 1 or not 0 < arrivals.burst_length_s <= arrivals.burst_every_s:
        raise ScenarioError("arrivals: need burst_factor >= 1, 0 < burst_length_s <= every")
    lengths = _get(doc, "lengths", dict, "scenario")
    phases = tuple(
        _phase(p, f"phases[{i}]") for i, p in enumerate(_get(doc, "phases", list, "scenario"))
    )
    _check_pairing(phases)
    sizes = {k: _size(v, f"sizes.{k}") for k, v in _get(doc, "sizes", dict, "scenario").items()}
    missing = [s for s in SIZES if s not in sizes]
    if missing or not phases:
        raise ScenarioError(f"scenario: need phases and sizes {SIZES} (missing {missing})")
    sy = doc.get("switchyard", {})
    rep = doc.get("report", {})
    scenario = Scenario(
        name=_get(doc, "name", str, "scenario"),
        description=str(doc.get("description", "")),
        seed=int(_get(doc, "seed", int, "scenario")),
        backends=backends,
        classes=classes,
        tenants=tenants,
        arrivals=arrivals,
        prompt=_length(_get(lengths, "prompt", dict, "lengths"), "lengths.prompt"),
        output=_length(_get(lengths, "output", dict, "lengths"), "lengths.output"),
        stream_share=float(_opt(doc, "stream_share", 0.5, "scenario")),
        prefix=_prefix(_opt(doc, "prefix", {}, "scenario")),
        phases=phases,
        sizes=sizes,
        switchyard=SwitchyardSpec(
            policies={str(k): str(v) for k, v in sy.get("policies", {}).items()},
            log_level=str(sy.get("log_level", "warning")),
            env={str(k): str(v) for k, v in sy.get("env", {}).items()},
        ),
        report=ReportSpec(
            slo_class=str(rep.get("slo_class", "")),
            baseline_phase=str(rep.get("baseline_phase", "")),
            flood_phase=str(rep.get("flood_phase", "")),
            added_p99_budget_ms=float(rep.get("added_p99_budget_ms", 10.0)),
        ),
        targets=tuple(doc.get("targets", ())),
        raw=copy.deepcopy(dict(doc)),
    )
    if not 0 <= scenario.stream_share <= 1:
        raise ScenarioError("stream_share must be in [0, 1]")
    longest = max(t.system_prompt_tokens for t in tenants) + scenario.prompt.high
    if scenario.prefix.enabled and longest + scenario.output.high > backends.max_model_len:
        raise ScenarioError(
            "prefix: the longest system prompt plus the longest prompt and output "
            f"({longest + scenario.output.high} tokens) must fit in backends.max_model_len"
        )
    for name in (scenario.report.baseline_phase, scenario.report.flood_phase):
        if name and name not in {p.name for p in phases}:
            raise ScenarioError(f"report: no phase named '{name}'")
    return scenario


def coerce(text: str) -> Any:
    """A command-line value as TOML would type it: bool, int, float, else the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        if not (isinstance(value, float) and not math.isfinite(value)):
            return value
    return text


def override(doc: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with the dotted ``path`` (list items by index) set to ``value``."""
    result = copy.deepcopy(dict(doc))
    node: Any = result
    parts = path.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ScenarioError(f"{path}: '{part}' is not an index of a {len(node)}-list")
            key: Any = int(part)
        elif isinstance(node, dict):
            key = part
            if not last:
                node = node.setdefault(key, {})
                continue
        else:
            raise ScenarioError(f"{path}: '{part}' goes inside a {type(node).__name__}")
        if last:
            node[key] = value
        else:
            node = node[key]
    return result


def load(path: Path, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Read, override (dotted path -> value) and validate a scenario file."""
    with path.open("rb") as handle:
        doc: dict[str, Any] = tomllib.load(handle)
    for dotted, value in (overrides or {}).items():
        doc = override(doc, dotted, value)
    return parse(doc)
