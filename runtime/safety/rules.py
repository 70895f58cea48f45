"""Policy packs as data: what a rule may say, and the field errors of a malformed pack.

A pack (:class:`runtime.snapshot.PolicyPackSnap`) is a named, versioned list of rules. The
control plane calls :func:`pack_errors` where it writes a pack (admin, REST) and refuses it
with the returned ``(field, message)`` pairs; the data plane only ever sees valid packs, and
compiles them with :mod:`runtime.safety.compiled`.
"""

from __future__ import annotations

import math
import re
from typing import Final

import msgspec

from runtime.safety.detectors import detector_names
from runtime.snapshot import PolicyPackSnap, SafetyRuleSnap

KINDS: Final = ("terms", "regex", "pii", "classifier")
INPUT_ACTIONS: Final = ("refuse", "redact")
OUTPUT_ACTIONS: Final = ("stop",)
ACTIONS_BY_KIND: Final = {
    "terms": ("refuse", "redact", "stop"),
    "regex": ("refuse", "redact", "stop"),
    "pii": ("refuse", "redact", "stop"),
    "classifier": ("refuse", "stop"),  # a score says "this text", not which characters
}
DEFAULT_REGEX_MAX_LEN: Final = 64
MAX_RULES: Final = 200
MAX_TERM_LEN: Final = 200
MAX_PATTERN_LEN: Final = 500
MAX_MATCH_LEN: Final = 4096

_RULE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Patterns are combined into one regex per action, so a pattern may not name or refer to
# groups (two patterns' names would clash, numbers would shift) nor set global flags.
_GROUP_REFS = re.compile(r"\(\?P[<=]|\(\?<(?![=!])|\\[1-9]|\\g<|\(\?[aiLmsux]+\)")

_NO_GROUPS: Final = ("named groups, back-references and global inline flags are not allowed "
                     "(use (?:...) and the case_sensitive field)")  # fmt: skip

# A quantified group that itself holds a quantifier ("(a+)+", "(x|y*)*", "(?:\w{2,})+") can
# backtrack exponentially on text a client sends: refused (a heuristic, not a proof).
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*(?:[+*]|\{\d*,?\d*\})(?:[^()\\]|\\.)*\)"
                                r"(?:[+*]|\{\d*,\d*\})")  # fmt: skip

FieldError = tuple[str, str]


def pack_errors(document: object) -> list[FieldError]:
    """Field errors of a pack given as JSON-like data (what a form or REST body holds)."""
    try:
        pack = msgspec.convert(document, PolicyPackSnap)
    except msgspec.ValidationError as exc:
        message, _, path = str(exc).rpartition(" - at `")
        if not message:  # no path: a field of the pack itself is missing
            return [("pack", str(exc))]
        return [(path.rstrip("`").removeprefix("$.").removeprefix("$") or "pack", message)]
    return validate_pack(pack)


def validate_pack(pack: PolicyPackSnap) -> list[FieldError]:
    """Every problem of ``pack`` as ``(field, message)``; empty when the pack is valid."""
    errors: list[FieldError] = []
    if not pack.name.strip():
        errors.append(("name", "a pack needs a name"))
    if pack.version < 1:
        errors.append(("version", "versions start at 1"))
    if len(pack.rules) > MAX_RULES:
        errors.append(("rules", f"at most {MAX_RULES} rules per pack"))
    seen: set[str] = set()
    for i, rule in enumerate(pack.rules):
        where = f"rules[{i}]"
        if not _RULE_ID.fullmatch(rule.id):
            errors.append((f"{where}.id", "1-64 letters, digits, '_', '.' or '-'"))
        elif rule.id in seen:
            errors.append((f"{where}.id", f"two rules are named {rule.id!r}"))
        seen.add(rule.id)
        errors.extend(rule_errors(rule, where))
    return errors


def rule_errors(rule: SafetyRuleSnap, where: str = "rule") -> list[FieldError]:
    """The field errors of one rule (``where`` prefixes the field names)."""
    if rule.kind not in KINDS:
        return [(f"{where}.kind", f"unknown kind {rule.kind!r} (known: {', '.join(KINDS)})")]
    errors: list[FieldError] = []
    allowed = ACTIONS_BY_KIND[rule.kind]
    if rule.action not in allowed:
        errors.append((f"{where}.action",
                       f"a {rule.kind} rule's action is one of {', '.join(allowed)}"))  # fmt: skip
    used = {"terms": rule.terms, "patterns": rule.patterns, "detectors": rule.detectors,
            "model": rule.model}  # fmt: skip
    wanted = {"terms": "terms", "regex": "patterns", "pii": "detectors", "classifier": "model"}
    for name, value in used.items():
        if value and name != wanted[rule.kind]:
            errors.append((f"{where}.{name}", f"not used by a {rule.kind} rule"))
    if not 0 <= rule.max_len <= MAX_MATCH_LEN:
        errors.append((f"{where}.max_len", f"between 0 and {MAX_MATCH_LEN}"))
    if rule.kind == "terms":
        errors.extend(_term_errors(rule, where))
    elif rule.kind == "regex":
        errors.extend(_pattern_errors(rule, where))
    elif rule.kind == "pii":
        errors.extend(_detector_errors(rule, where))
    else:
        if not rule.model.strip():
            errors.append((f"{where}.model", "a classifier rule names a registered model"))
        if math.isnan(rule.threshold) or not 0.0 <= rule.threshold <= 1.0:
            errors.append((f"{where}.threshold", "a score between 0 and 1"))
    return errors


def _term_errors(rule: SafetyRuleSnap, where: str) -> list[FieldError]:
    if not rule.terms:
        return [(f"{where}.terms", "an empty term list blocks nothing")]
    errors: list[FieldError] = []
    for j, term in enumerate(rule.terms):
        if not term.strip():
            errors.append((f"{where}.terms[{j}]", "a blank term"))
        elif len(term) > MAX_TERM_LEN:
            errors.append((f"{where}.terms[{j}]", f"at most {MAX_TERM_LEN} characters"))
    return errors


def _pattern_errors(rule: SafetyRuleSnap, where: str) -> list[FieldError]:
    if not rule.patterns:
        return [(f"{where}.patterns", "an empty pattern list matches nothing")]
    errors: list[FieldError] = []
    for j, pattern in enumerate(rule.patterns):
        field = f"{where}.patterns[{j}]"
        if len(pattern) > MAX_PATTERN_LEN:
            errors.append((field, f"at most {MAX_PATTERN_LEN} characters"))
            continue
        if _GROUP_REFS.search(pattern):
            errors.append((field, _NO_GROUPS))
            continue
        if _NESTED_QUANTIFIER.search(pattern):
            errors.append((field, "a repeated group that repeats inside can take exponential "
                                  "time on some inputs; rewrite it without nesting"))  # fmt: skip
            continue
        try:
            compiled = re.compile(f"(?P<g>(?:{pattern}))")
        except re.error as exc:
            errors.append((field, f"not a valid regular expression: {exc}"))
            continue
        if compiled.fullmatch("") is not None:
            errors.append((field, "matches the empty string (it would match everywhere)"))
    return errors


def _detector_errors(rule: SafetyRuleSnap, where: str) -> list[FieldError]:
    if not rule.detectors:
        return [(f"{where}.detectors", "name at least one detector")]
    known = detector_names()
    return [
        (f"{where}.detectors[{j}]", f"unknown detector {name!r} (known: {', '.join(known)})")
        for j, name in enumerate(rule.detectors)
        if name not in known
    ]
