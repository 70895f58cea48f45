"""The real-vLLM prefix run: two vLLM CPU replicas of the demo model behind the router, long
shared system prompts, load-only vs prefix-aware routing (issue 35, must-have 5's last part).

It is the shared-prefix scenario (``bench/scenarios/prefix.toml``: tenants with long system
prompts, growing conversations, a share of unique prompts) scaled to what two vLLM CPU engines
of the tiny demo Llama serve on a small machine, played by the harness (``bench.runner``)
against ``direct`` (round robin), ``switchyard-load-only`` (pool policy ``prefix_routing =
"off"``), ``switchyard`` (prefix-aware, approximate) and ``switchyard-precise`` (prefix-aware
from the engines' KV events), one after the other on the same two engines, each phase from
reset prefix caches (``VLLM_SERVER_DEV_MODE=1`` serves ``/reset_prefix_cache``). It prints,
per phase and target, the engines' prefix-cache hit rate (``vllm:prefix_cache_hits`` ÷
``queries``, tokens) and the TTFT p50/p95, and each prefix-aware target's TTFT p50 as a ratio
of load-only's::

    .venv/bin/python -m bench.prefix_vllm --out /tmp/prefix-vllm            # ~15 min
    .venv/bin/python -m bench.prefix_vllm --size smoke --out /tmp/prefix-vllm-smoke

The demo tokenizer makes about 1.8 characters a token, so the scenario's stand-in token counts
(4 characters each) are about twice as many demo tokens; the system prompts are sized so that a
conversation's longest turn stays under the engines' 2,048-token context. vLLM on CPU caches
blocks of 128 tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.runner import DEFAULT_REDIS_URL, run_sync
from bench.scenario import Scenario, parse
from bench.targets import ALL

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "prefix.toml"
LOAD_ONLY = "switchyard-load-only"  # pool policy prefix_routing = "off": least_load alone
PREFIX_TARGETS = ("switchyard", "switchyard-precise")  # approximate; from the KV events
MODEL = "demo-llama"
ENGINE_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
SYSTEM_PROMPT_TOKENS = {"acme": 300, "globex": 250, "initech": 200}  # x ~2.2 demo tokens


def scenario_doc(model_path: Path) -> dict[str, Any]:
    """prefix.toml with two vLLM CPU backends and loads and lengths they can serve."""
    with SCENARIO.open("rb") as handle:
        doc: dict[str, Any] = tomllib.load(handle)
    extra = ["--dtype", "float32", "--enforce-eager", "--enable-prefix-caching"]
    doc["name"] = "prefix-vllm"
    doc["description"] = "long shared system prompts over 2 vLLM CPU engines of the demo model"
    doc["backends"] = {
        "kind": "vllm",
        "count": 2,
        "model": MODEL,
        "model_path": str(model_path),
        "max_num_seqs": 8,
        "max_model_len": 2048,
        "extra_args": extra,
        "kv_events": True,  # switchyard-precise subscribes; the other targets ignore them
    }
    doc["prefix"] = {"unique_share": 0.2, "conversations": 4, "max_turns": 4}
    doc["lengths"] = {
        "prompt": {"mu": 3.0, "sigma": 0.4, "min": 4, "max": 40},  # ~20 stand-in tokens
        "output": {"mu": 2.5, "sigma": 0.3, "min": 2, "max": 16},
    }
    for tenant in doc["tenants"]:
        tenant["system_prompt_tokens"] = SYSTEM_PROMPT_TOKENS[tenant["name"]]
    doc["classes"][0]["ttft_slo_ms"] = 2000
    doc["phases"] = [{"name": "load-1", "rate_rps": 1.0}, {"name": "load-2", "rate_rps": 2.0}]
    doc["sizes"] = {
        "smoke": {
            "phase_duration_s": 10.0, "drain_timeout_s": 30.0, "request_timeout_s": 120.0,
            "max_requests_per_phase": 100, "warmup_requests": 2, "phases": ["load-1"],
        },
        "full": {
            "phase_duration_s": 60.0, "drain_timeout_s": 60.0, "request_timeout_s": 180.0,
            "max_requests_per_phase": 1000, "warmup_requests": 2,
        },
    }  # fmt: skip
    return doc


def summary(report: dict[str, Any], prefix_targets: Sequence[str]) -> list[str]:
    """One line per phase and target, then the ratios (prefix-aware ÷ load-only)."""
    lines = [f"{'phase':<10} {'target':<28} {'ok':>5} {'hit rate':>9} {'TTFT p50':>9} {'p95':>9}"]
    phases: dict[str, Any] = report.get("phases", {})
    for phase_name, phase in phases.items():
        targets: dict[str, Any] = phase.get("targets", {})
        for name, figures in targets.items():
            hit = (figures.get("prefix_cache") or {}).get("hit_rate")
            ttft = figures.get("ttft_ms") or {}
            lines.append(
                f"{phase_name:<10} {name:<28} {figures.get('ok', 0):>5} "
                f"{'-' if hit is None else f'{hit:.1%}':>9} {_ms(ttft.get('p50')):>9} "
                f"{_ms(ttft.get('p95')):>9}"
            )
        base = (targets.get(LOAD_ONLY, {}).get("ttft_ms") or {}).get("p50")
        for prefix_target in prefix_targets:
            ours = (targets.get(prefix_target, {}).get("ttft_ms") or {}).get("p50")
            if base and ours:
                lines.append(f"{'':<10} TTFT p50 {prefix_target} / {LOAD_ONLY}: {ours / base:.2f}")
    return lines


def _ms(value: object) -> str:
    return f"{value:.0f}" if isinstance(value, int | float) else "-"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prefix_vllm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", default="full", choices=["smoke", "full"])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="the demo model (default: <out>/demo-llama)"
    )
    parser.add_argument("--targets", default=",".join(PREFIX_TARGETS),
                        help="the prefix-aware targets (%(default)s)")  # fmt: skip
    parser.add_argument("--no-pin", action="store_true", help="do not pin the router (taskset)")
    args = parser.parse_args(argv)
    prefix_targets = [t for t in args.targets.split(",") if t]
    targets = ["direct", LOAD_ONLY, *prefix_targets]
    unknown = [t for t in targets if t not in ALL]
    if unknown:
        parser.error(f"unknown target {', '.join(unknown)} (known: {', '.join(ALL)})")
    from apps.models.demo import ensure_demo_model  # noqa: PLC0415 - torch: only when run

    artifact, _ = ensure_demo_model(args.model_dir or args.out / MODEL)
    scenario: Scenario = parse(scenario_doc(artifact.path))
    os.environ.update(ENGINE_ENV)  # the engines inherit it (bench.targets.base.python_env)
    report = run_sync(
        scenario,
        out_dir=args.out,
        pin=not args.no_pin,
        size=args.size,
        target_names=targets,
        redis_url=os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL,
        command=["python", "-m", "bench.prefix_vllm", *(argv or sys.argv[1:])],
        flame=False,
    )
    sys.stdout.write("\n".join(summary(report, prefix_targets)) + "\n")


if __name__ == "__main__":
    main()
