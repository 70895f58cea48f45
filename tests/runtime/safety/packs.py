"""Policy packs the safety tests share."""

from __future__ import annotations

from runtime.snapshot import PolicyPackSnap, SafetyRuleSnap


def rule(id: str, kind: str, action: str, **fields: object) -> SafetyRuleSnap:
    return SafetyRuleSnap(id=id, kind=kind, action=action, **fields)  # type: ignore[arg-type]


def pack(name: str = "base", version: int = 1, *rules: SafetyRuleSnap) -> PolicyPackSnap:
    return PolicyPackSnap(name=name, version=version, rules=rules)


def twenty_rule_pack(name: str = "twenty", version: int = 1) -> PolicyPackSnap:
    """A pack of 20 rules of every matching kind: what the goal and the bench measure."""
    rules = [
        rule("pii-in", "pii", "redact",
             detectors=("email", "phone", "credit_card", "iban", "us_ssn", "ipv4")),
        rule("pii-out", "pii", "stop", detectors=("credit_card", "us_ssn")),
        rule("weapons", "terms", "refuse", terms=("build a bomb", "nerve agent", "pipe bomb")),
        rule("secret-key", "regex", "refuse", patterns=(r"sk-[A-Za-z0-9]{20,48}",), max_len=51),
        rule("banned-out", "terms", "stop", terms=("forbidden phrase", "zebra crossing now")),
    ]  # fmt: skip
    for i in range(15):
        action = ("refuse", "redact", "stop")[i % 3]
        if i % 2:
            rules.append(rule(f"terms-{i}", "terms", action,
                              terms=tuple(f"blockedterm{i}x{j}" for j in range(5))))  # fmt: skip
        else:
            patterns = (rf"code-{i}-[0-9]{{4,8}}", rf"tag{i}:[a-z]{{6}}\b")
            rules.append(rule(f"regex-{i}", "regex", action, patterns=patterns))
    return PolicyPackSnap(name=name, version=version, rules=tuple(rules))
