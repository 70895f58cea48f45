"""Policy packs the safety tests share."""

from __future__ import annotations

from bench.safety_micro import twenty_rule_pack
from runtime.snapshot import PolicyPackSnap, SafetyRuleSnap

__all__ = ["pack", "rule", "twenty_rule_pack"]


def rule(id: str, kind: str, action: str, **fields: object) -> SafetyRuleSnap:
    return SafetyRuleSnap(id=id, kind=kind, action=action, **fields)  # type: ignore[arg-type]


def pack(name: str = "base", version: int = 1, *rules: SafetyRuleSnap) -> PolicyPackSnap:
    return PolicyPackSnap(name=name, version=version, rules=rules)
