"""One simulated engine of :mod:`bench.dispatch_sim`: vLLM V1's step loop with chunked prefill.

A step schedules, within a token budget (vLLM's ``max_num_batched_tokens``), first the
running sequences in the order they were admitted (a decode costs one token of the budget, a
prefill still in progress the rest of its prompt, cut to what is left), then the waiting ones,
oldest first (or by priority band, lowest first, with ``priority``: vLLM's
``--scheduling-policy priority``), while budget and sequences (``max_num_seqs``) remain; the
last one admitted may prefill only a chunk of its prompt. The step lasts
``prefill_tokens / prefill_tps + decode_a_ms + decode_b_ms * scheduled`` (the calibrated
:class:`~runtime.workers.simulator.timing.TimingModel`, with ``scheduled`` the sequences in the
step), and at its end every sequence it decoded, or whose prompt it finished prefilling, has a
new token. Nothing preempts inside the engine (KV blocks are not modelled).

Prefix caching over each sequence's own tokens (``EngineOptions.resume_cache``, the
faithful model of a free resume through vLLM's prefix cache, issue #34): every engine keeps
a :class:`~runtime.workers.simulator.prefix_cache.PrefixCache` (LRU over blocks, the
backends' ``block_size`` and ``prefix_cache_blocks``). A sequence's full blocks of prompt and
generated tokens go into its engine's cache when they are freed (it ends, or it is preempted:
what it had computed by then), as vLLM V1 frees an aborted request's blocks into its free
queue, cached until evicted; its tokens are its own, so only a resume of the same sequence
hits them (:func:`~runtime.workers.simulator.prefix_cache.sequence_block_hashes`). A resume
admitted on an engine prefills its prompt plus what it generated less the cached run (at most
the context less one token, as vLLM recomputes the last); on another engine, or after
eviction, all of it. Unlike vLLM, cached blocks do not compete with the running sequences'
blocks for the capacity.

vLLM V1's defaults: chunked prefill always on; ``max_num_batched_tokens`` 2,048 for the
OpenAI server on GPUs under 70 GiB or A100s, 8,192 on H100-class ones (``EngineArgs``'s
usage-context defaults); ``long_prefill_token_threshold`` 0 (no cap below the budget).
``budget=None`` is the simulator worker (:mod:`runtime.workers.simulator`): every prefill
whole in the step that admits it, the model the harness's backends run; with a budget no
step needs more than its prompts, the two give the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.workers.simulator.prefix_cache import PrefixCache, sequence_block_hashes
from runtime.workers.simulator.timing import TimingModel

if TYPE_CHECKING:
    from bench.workload import Planned
    from runtime.scheduling.grant import Grant

VLLM_BUDGET = 2048  # max_num_batched_tokens, vLLM V1's OpenAI server under 70 GiB


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How the simulated engines schedule: ``budget`` vLLM's ``max_num_batched_tokens``
    (None: whole prefills, the simulator worker), ``priority`` its waiting queue by band
    (the pool policy ``upstream_priority=on``); ``free_resume``, an oracle no engine has: a
    resumed generation prefills only what it had not prefilled when it was preempted (its
    KV cache survives the preemption at no cost; :mod:`bench.preempt_bound`);
    ``resume_cache``, the faithful model of that: each engine's prefix cache holds the
    blocks its sequences freed, and a resume there prefills only what it does not hold
    (module docstring)."""

    budget: int | None = None
    priority: bool = False
    free_resume: bool = False  # an oracle: a preempted generation keeps its KV for free
    resume_cache: bool = False  # engines cache freed sequences' blocks (prompt + generated)

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"budget must be >= 1 or None, got {self.budget}")


@dataclass(slots=True, eq=False)
class Seq:
    """One generation on an engine (identity compares: two are never the same)."""

    grant: Grant
    planned: Planned
    arrived: float
    left: int  # tokens still to produce
    started: bool = False
    prompt_tokens: int = 0  # as the simulator counts the rendered prompt (with a prefix cache)
    block_hashes: tuple[int, ...] = ()  # the engine's block hashes of the prompt
    cached: int = 0  # prompt tokens the engine's prefix cache held at admission
    generated: int = 0  # output tokens so far (kept across a preemption)
    prefill: int | None = None  # what its next admission prefills; None: the planned prompt
    deadline: float = 0.0  # its ticket's deadline, kept when it re-queues after a preemption
    started_at: float = 0.0  # when it last took a slot
    preempted: int = 0  # times it was preempted
    band: int = 0  # its ticket's priority band (the engine's priority with ``priority``)
    todo: int = 0  # prompt tokens still to prefill since its admission to the engine
    paused_at: float | None = None  # when it was last preempted, until its next token
    resumed_at: float = 0.0  # when it got a slot again after its last preemption
    key: int = 0  # names its own tokens in the engines' caches (``resume_cache``)

    def context(self) -> int:
        """Its prompt plus what it generated: a resume's whole prefill."""
        return self.planned.prompt_tokens + self.generated


@dataclass(slots=True)
class Engine:
    """One backend (module docstring): ``waiting`` granted but not yet scheduled, ``running``
    scheduled at least once since its grant, ``plan`` the step in flight."""

    running: list[Seq] = field(default_factory=list)
    waiting: list[Seq] = field(default_factory=list)
    budget: int | None = None  # max_num_batched_tokens; None: whole prefills
    max_num_seqs: int = 1 << 30
    priority: bool = False
    cache: PrefixCache | None = None
    own: PrefixCache | None = None  # freed sequences' own blocks (``resume_cache``)
    plan: list[tuple[Seq, int]] = field(default_factory=list)  # (sequence, prompt tokens)
    stepping: bool = False

    def remove(self, seq: Seq) -> None:
        """Take ``seq`` off the engine (a preemption); the step in flight gives it nothing."""
        (self.running if seq in self.running else self.waiting).remove(seq)

    def freed(self, seq: Seq, computed: int) -> None:
        """``seq`` leaves this engine (it ended or was preempted) having computed the KV of
        its first ``computed`` tokens: their full blocks stay cached (``resume_cache``)."""
        own = self.own
        if own is not None and computed > 0:
            own.admit(sequence_block_hashes(seq.key, computed, own.config.block_size), computed)

    def computed(self, seq: Seq) -> int:
        """Tokens of ``seq``'s context whose KV this engine holds now (0 while it waits)."""
        if seq not in self.running:
            return 0
        return seq.context() - max(seq.todo, 0)

    def _need(self, seq: Seq) -> int:
        if self.own is not None and seq.prefill is not None:  # a resume: what is not cached
            size = self.own.config.block_size
            seq.cached = self.own.hit_tokens(
                sequence_block_hashes(seq.key, seq.prefill, size), seq.prefill
            )
            return seq.prefill - seq.cached
        if self.cache is not None and seq.prefill is None:
            seq.cached = self.cache.admit(seq.block_hashes, seq.prompt_tokens)
            return seq.prompt_tokens - seq.cached
        return seq.planned.prompt_tokens if seq.prefill is None else seq.prefill

    def schedule(self, timing: TimingModel) -> float | None:
        """Plan the next step (module docstring); its duration in seconds, None if idle."""
        budget = float("inf") if self.budget is None else float(self.budget)
        plan: list[tuple[Seq, int]] = []
        for seq in self.running:
            if budget <= 0:
                break
            chunk = int(min(seq.todo, budget))
            budget -= max(chunk, 1)
            plan.append((seq, chunk))
        if self.priority:
            self.waiting.sort(key=lambda s: s.band)  # stable: oldest first within a band
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.pop(0)
            seq.todo = self._need(seq)
            chunk = int(min(seq.todo, budget))
            budget -= max(chunk, 1)
            self.running.append(seq)
            plan.append((seq, chunk))
        self.plan = plan
        if not plan:
            return None
        prefill = sum(chunk for _, chunk in plan)
        return timing.step_seconds(batch_size=len(plan), prefill_tokens=prefill)

    def finish(self) -> list[Seq]:
        """End the step in flight: the sequences that have a new token now."""
        out: list[Seq] = []
        for seq, chunk in self.plan:
            if seq not in self.running:  # preempted during the step
                continue
            seq.todo -= chunk
            if seq.todo <= 0:
                out.append(seq)
        self.plan = []
        return out
