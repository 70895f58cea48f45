"""Does a resume hit vLLM's prefix cache? A cut stream resumed on the same engine, warm
against cold (issue 34: free resume through the engine's prefix cache).

One vLLM CPU engine of the demo model (prefix caching on, ``VLLM_SERVER_DEV_MODE=1`` for
``/reset_prefix_cache``). Per round, a fresh long prompt (random words, its own seed, so no
round finds another's blocks) is streamed as a completion with greedy decoding and cut after
``--cut`` tokens (the client closes the stream: vLLM aborts the request, its blocks are
freed but stay cached). The resume is what ``runtime.gateway.resume`` sends: the prompt
followed by the text so far, ``max_tokens`` the rest. Two arms, ABBA over the rounds:

- ``warm``: the resume goes to the same engine at once;
- ``cold``: the prefix cache is reset first (``POST /reset_prefix_cache``), so the resume
  prefills prompt + generated text in full: one prefill of its context.

Both resume by token ids (the prompt's and the generated ones, ``return_token_ids``), which
hit whatever the tokenizer does. Two more arms send what ``runtime.gateway.resume`` sends,
the prompt followed by the text so far, to the same engine at once: ``text`` on the random
words prompt (the demo model's continuation of it holds partial UTF-8 characters and does not
round-trip through the tokenizer) and ``phrase`` on a prompt of the phrases the demo
tokenizer was trained on (whose continuation mostly round-trips).

Per resume it reads ``vllm:prefix_cache_hits`` / ``queries`` (tokens) and the engine's own
prefill time (``vllm:request_prefill_time_seconds``'s sum) from ``/metrics`` before and
after, and the resume's TTFT (first token chunk, wall clock, client side). It
prints the hit tokens against what a full hit could be (vLLM hashes full blocks only, and
always computes the last token: ``(n - 1) // block * block``), whether the blocks of the
generated tokens were hit, and the TTFT ratio warm ÷ cold per ABBA pair::

    .venv/bin/python -m bench.resume_vllm --out /tmp/resume-vllm            # ~3 min
    .venv/bin/python -m bench.resume_vllm --out /tmp/resume-vllm --rounds 8 --cut 384

The demo model is tiny (2 layers, 128 wide): a prefill of 2,000 tokens is tens of
milliseconds on CPU, so the TTFT ratio is bounded below by the request's fixed cost; the hit
counts are the finding, the ratio its lower-bound illustration.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

MODEL = "demo-llama"
ARMS = ("warm", "cold", "text", "phrase")
PHRASES = ("user: hello", "assistant: songs", "user: what is", "assistant: credits",
           "user: scheduler")  # fmt: skip
MAX_LEN = 2048  # the demo model's context
BLOCK_TOKENS = 128  # vLLM's KV block on CPU (the block size hashed by its prefix cache)
START_TIMEOUT_S = 420.0
ENGINE_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
HIT_METRIC = "vllm:prefix_cache_hits_total"
QUERY_METRIC = "vllm:prefix_cache_queries_total"
PREFILL_METRIC = "vllm:request_prefill_time_seconds_sum"
RESET_TIMEOUT_S = 10.0
RESET_POLL_S = 0.05
METRICS_WAIT_S = 2.0


@dataclass(frozen=True)
class Resume:
    """One resume: its arm, the context it sent (tokens), what the prefix cache gave it."""

    arm: str
    prompt_tokens: int  # the original prompt
    generated: int  # tokens before the cut
    context_tokens: int  # the continuation's prompt, as the engine tokenizes it
    round_trips: bool  # the continuation's tokens are the prompt's then the generated ones
    hit_tokens: int
    query_tokens: int
    ttft_s: float
    prefill_s: float  # the engine's prefill time of the resume (its histogram's sum)

    @property
    def full_hit(self) -> int:
        """The most vLLM can hit: full blocks, the last token always computed."""
        return (self.context_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS

    @property
    def generated_hit(self) -> int:
        """Hit tokens past the original prompt's full blocks: the generated tokens' blocks."""
        return max(0, self.hit_tokens - prompt_blocks(self))


def prompt_blocks(resume: Resume) -> int:
    """The tokens in the original prompt's full blocks."""
    return resume.prompt_tokens // BLOCK_TOKENS * BLOCK_TOKENS


def metric_total(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples (every label set) in ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def words_prompt(
    seed: int, tokens: int, client: httpx.Client, base: str, *, phrases: bool = False
) -> tuple[str, int]:
    """Random words (its own seed) trimmed to about ``tokens`` demo tokens; (text, tokens).
    With ``phrases``, random phrases the demo tokenizer was trained on instead: the demo
    model's greedy continuation of those mostly round-trips through its tokenizer (random
    words' continuation does not: it holds partial UTF-8 characters)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    if phrases:
        words = [rng.choice(PHRASES) for _ in range(tokens)]
    else:
        words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
                 for _ in range(tokens)]  # fmt: skip
    text = " ".join(words)
    ids = tokenize(client, base, text)
    while len(ids) > tokens:
        words = words[: max(1, len(words) * tokens // len(ids) - 1)]
        text = " ".join(words)
        ids = tokenize(client, base, text)
    return text, len(ids)


def tokenize(client: httpx.Client, base: str, text: str) -> list[int]:
    resp = client.post(f"{base}/tokenize", json={"model": MODEL, "prompt": text,
                                                 "add_special_tokens": True})  # fmt: skip
    resp.raise_for_status()
    tokens: list[int] = resp.json()["tokens"]
    return tokens


@dataclass
class Streamed:
    """A streamed completion as the client saw it: text, token ids, time to first token."""

    text: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    ttft_s: float = float("nan")


def stream(
    client: httpx.Client, base: str, prompt: str | list[int], max_tokens: int, cut: int | None
) -> Streamed:
    """Stream a greedy completion; stop reading after ``cut`` tokens (the client closes:
    vLLM aborts the request)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}  # fmt: skip
    out = Streamed()
    parts: list[str] = []
    started = time.perf_counter()
    with client.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as resp:
        if resp.status_code != 200:
            resp.read()
            raise RuntimeError(f"vLLM answered {resp.status_code}: {resp.text[:300]}")
        for line in resp.iter_lines():
            data = line.removeprefix("data: ")
            if not data or data in ("[DONE]", line):
                continue
            choices = json.loads(data).get("choices") or []
            if not choices:
                continue
            choice = choices[0]
            if not out.ids:
                out.ttft_s = time.perf_counter() - started
                out.prompt_ids = list(choice.get("prompt_token_ids") or [])
            parts.append(choice.get("text") or "")
            out.ids.extend(choice.get("token_ids") or [])
            if cut is not None and len(out.ids) >= cut:
                break
    out.text = "".join(parts)
    return out


def reset_prefix_cache(client: httpx.Client, base: str) -> None:
    """Reset, retried while an aborted request's blocks are still held (bounded)."""
    deadline = time.monotonic() + RESET_TIMEOUT_S
    while True:
        resp = client.post(f"{base}/reset_prefix_cache")
        resp.raise_for_status()
        if resp.json().get("success", True):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the prefix cache could not be reset (blocks still held)")
        time.sleep(RESET_POLL_S)


def one_round(
    client: httpx.Client, base: str, *, arm: str, seed: int, prompt_tokens: int, cut: int,
    tail: int, max_len: int,
) -> Resume | None:  # fmt: skip
    """Cut a fresh prompt's stream after ``cut`` tokens and resume it (module docstring);
    None when the text continuation would not fit the context (it did not round-trip)."""
    prompt, _ = words_prompt(seed, prompt_tokens, client, base, phrases=arm == "phrase")
    first = stream(client, base, prompt, cut + tail, cut)
    expected = first.prompt_ids + first.ids
    resumed: str | list[int] = expected  # by token ids: exact whatever the tokenizer does
    ids = expected
    if arm in ("text", "phrase"):  # what runtime.gateway.resume sends: prompt, text so far
        resumed = prompt + first.text
        ids = tokenize(client, base, resumed)
        if len(ids) + tail > max_len:
            return None
    elif arm == "cold":
        reset_prefix_cache(client, base)
    before = client.get(f"{base}/metrics").text
    second = stream(client, base, resumed, tail, None)
    after = client.get(f"{base}/metrics").text
    deadline = time.monotonic() + METRICS_WAIT_S  # the stat logger may lag a step
    while metric_total(after, PREFILL_METRIC) == metric_total(before, PREFILL_METRIC):
        if time.monotonic() > deadline:
            break
        time.sleep(RESET_POLL_S)
        after = client.get(f"{base}/metrics").text
    hits = metric_total(after, HIT_METRIC) - metric_total(before, HIT_METRIC)
    queries = metric_total(after, QUERY_METRIC) - metric_total(before, QUERY_METRIC)
    prefill = metric_total(after, PREFILL_METRIC) - metric_total(before, PREFILL_METRIC)
    return Resume(arm=arm, prompt_tokens=len(first.prompt_ids), generated=len(first.ids),
                  context_tokens=len(ids), round_trips=ids == expected, hit_tokens=int(hits),
                  query_tokens=int(queries), ttft_s=second.ttft_s,
                  prefill_s=prefill)  # fmt: skip


def start_engine(model_path: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    from runtime.workers.launch import OFFLINE_ENV, WorkerSpec, build_command  # noqa: PLC0415

    spec = WorkerSpec(artifact_dir=model_path, expected_digest="", served_model_name=MODEL,
                      port=port, max_num_seqs=8,
                      extra_args=("--enable-prefix-caching",))  # fmt: skip
    env = {**os.environ, **OFFLINE_ENV, **ENGINE_ENV}
    with log.open("wb") as out:
        argv = build_command(spec)
        return subprocess.Popen(  # noqa: S603 - our own argv
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"vLLM not healthy within {START_TIMEOUT_S:.0f} s; see {log}")


def report(resumes: Sequence[Resume]) -> list[str]:
    """A line per resume, then the hits and the TTFT ratio warm / cold (ABBA pairs)."""
    lines = [f"{'arm':<5} {'prompt':>6} {'gen':>4} {'ctx':>5} {'rt':>3} {'hits':>5} "
             f"{'full':>5} {'gen hit':>7} {'TTFT ms':>8} {'prefill ms':>10}"]  # fmt: skip
    lines += [
        f"{r.arm:<5} {r.prompt_tokens:>6} {r.generated:>4} {r.context_tokens:>5} "
        f"{'y' if r.round_trips else 'n':>3} {r.hit_tokens:>5} {r.full_hit:>5} "
        f"{r.generated_hit:>7} {r.ttft_s * 1000:>8.1f} {r.prefill_s * 1000:>10.1f}"
        for r in resumes
    ]
    by_arm = {arm: [r for r in resumes if r.arm == arm] for arm in ARMS}
    for arm, rows in by_arm.items():
        if rows:
            lines.append(
                f"{arm}: hits {sum(r.hit_tokens for r in rows)} of "
                f"{sum(r.full_hit for r in rows)} possible, generated blocks "
                f"{sum(r.generated_hit for r in rows)} of "
                f"{sum(r.full_hit - prompt_blocks(r) for r in rows)}"
                f"; TTFT median {statistics.median(r.ttft_s for r in rows) * 1000:.1f} ms"
                f", engine prefill median "
                f"{statistics.median(r.prefill_s for r in rows) * 1000:.1f} ms"
            )
    warm, cold = by_arm["warm"], by_arm["cold"]
    pairs = list(zip(warm, cold, strict=False))
    for what, value in (("TTFT", "ttft_s"), ("engine prefill", "prefill_s")):
        ratios = [getattr(w, value) / getattr(c, value) for w, c in pairs
                  if getattr(c, value) > 0]  # fmt: skip
        if ratios:
            lines.append(f"{what} warm / cold per pair: " + ", ".join(f"{x:.2f}" for x in ratios)
                         + f"; median {statistics.median(ratios):.2f}")  # fmt: skip
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.resume_vllm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--rounds", type=int, default=12, help="resumes, ABCCBA over the arms")
    parser.add_argument("--prompt-tokens", type=int, default=1200)
    parser.add_argument("--cut", type=int, default=384, help="tokens before the cut")
    parser.add_argument("--tail", type=int, default=8, help="tokens the resume generates")
    parser.add_argument("--base-url", default=None, help="a running engine (else one starts)")
    args = parser.parse_args(argv)
    if args.prompt_tokens + args.cut + args.tail > MAX_LEN:
        parser.error("prompt + cut + tail exceed the demo model's 2,048-token context")
    args.out.mkdir(parents=True, exist_ok=True)
    proc = None
    base = args.base_url
    if base is None:
        from apps.models.demo import ensure_demo_model  # noqa: PLC0415 - torch: only when run
        from runtime.procs import free_port  # noqa: PLC0415

        artifact, _ = ensure_demo_model(args.out / MODEL)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_engine(artifact.path, port, args.out / "vllm.log")
    try:
        if proc is not None:
            wait_healthy(proc, base, args.out / "vllm.log")
        order = [*ARMS, *reversed(ARMS)]  # ABCCBA
        resumes: list[Resume] = []
        with httpx.Client(timeout=60) as client:
            stream(client, base, "warm up", 4, None)
            for i in range(args.rounds):
                resume = one_round(client, base, arm=order[i % len(order)], seed=1000 + i,
                                   prompt_tokens=args.prompt_tokens, cut=args.cut,
                                   tail=args.tail, max_len=MAX_LEN)  # fmt: skip
                if resume is not None:
                    resumes.append(resume)
        lines = report(resumes)
        (args.out / "resumes.json").write_text(json.dumps([r.__dict__ for r in resumes], indent=1))
        sys.stdout.write("\n".join(lines) + "\n")
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
