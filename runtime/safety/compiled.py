"""Policy packs compiled for matching: one combined regex per action, built once per version.

Each action of a pack (``refuse``, ``redact``, ``stop``) gets a :class:`Matcher`: every term,
pattern and detector of the rules with that action becomes one named alternative of a single
regex, so a 20-rule pack costs one scan of the text (the regex engine tries the alternatives
at each position), not twenty. The group that matched names the rule (``Match.lastgroup``:
our wrapper group is the outermost, so it closes last). Detectors with a checksum reject a
candidate after the match and the scan goes on.

:class:`PackCache` keeps the compiled packs by ``(name, version)``: a new snapshot with the
same pack versions recompiles nothing. It is an object the gateway holds (no module state).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from runtime.safety.detectors import detectors_by_name
from runtime.safety.rules import DEFAULT_REGEX_MAX_LEN
from runtime.snapshot import PolicyPackSnap, SafetyRuleSnap, SafetySnap


@dataclass(frozen=True, slots=True)
class Part:
    """What one alternative of a combined regex stands for."""

    rule: str  # the rule's id
    label: str  # what a redaction writes: the detector's name, else the rule's id
    valid: Callable[[str], bool] | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    pack: str
    rule: str
    label: str
    start: int
    end: int


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _term_regex(term: str) -> str:
    body = re.escape(term)
    return ("\\b" if _word(term[0]) else "") + body + ("\\b" if _word(term[-1]) else "")


class Matcher:
    """One combined regex over the rules of one action of one pack."""

    __slots__ = ("max_len", "pack", "parts", "regex")

    def __init__(self, pack: str, rules: tuple[SafetyRuleSnap, ...]) -> None:
        self.pack = pack
        self.parts: dict[str, Part] = {}
        alternatives: list[str] = []
        self.max_len = 1
        detectors = detectors_by_name()
        for rule in rules:
            flags = "" if rule.case_sensitive else "(?i:"
            close = "" if rule.case_sensitive else ")"
            if rule.kind == "terms":
                terms = sorted(set(rule.terms), key=len, reverse=True)  # longest first
                body = "|".join(_term_regex(t) for t in terms)
                self._add(alternatives, f"{flags}(?:{body}){close}", Part(rule.id, rule.id))
                self.max_len = max(self.max_len, *(len(t) for t in terms))
            elif rule.kind == "regex":
                body = "|".join(f"(?:{p})" for p in rule.patterns)
                self._add(alternatives, f"{flags}(?:{body}){close}", Part(rule.id, rule.id))
                self.max_len = max(self.max_len, rule.max_len or DEFAULT_REGEX_MAX_LEN)
            elif rule.kind == "pii":
                for name in rule.detectors:
                    detector = detectors[name]
                    self._add(alternatives, detector.pattern,
                              Part(rule.id, detector.name, detector.valid))  # fmt: skip
                    self.max_len = max(self.max_len, detector.max_len)
        self.regex = re.compile("|".join(alternatives)) if alternatives else None

    def _add(self, alternatives: list[str], body: str, part: Part) -> None:
        group = f"r{len(self.parts)}"
        self.parts[group] = part
        alternatives.append(f"(?P<{group}>{body})")

    def hits(self, text: str, pos: int = 0) -> Iterator[Hit]:
        """The matches in ``text`` from ``pos`` on, left to right, checksums applied."""
        if self.regex is None:
            return
        for m in self.regex.finditer(text, pos):
            part = self.parts[m.lastgroup or ""]
            if part.valid is not None and not part.valid(m.group()):
                continue
            yield Hit(self.pack, part.rule, part.label, m.start(), m.end())

    def first(self, text: str, pos: int = 0) -> Hit | None:
        return next(self.hits(text, pos), None)

    def redact(self, text: str) -> tuple[str, list[Hit]]:
        """``text`` with every match replaced by ``[REDACTED:<label>]``, and the matches."""
        found = list(self.hits(text))
        if not found:
            return text, found
        pieces: list[str] = []
        at = 0
        for hit in found:
            pieces.append(text[at : hit.start])
            pieces.append(f"[REDACTED:{hit.label}]")
            at = hit.end
        pieces.append(text[at:])
        return "".join(pieces), found


@dataclass(frozen=True, slots=True)
class CompiledPack:
    name: str
    version: int
    refuse: Matcher
    redact: Matcher
    stop: Matcher
    classify_input: tuple[SafetyRuleSnap, ...]  # classifier rules whose action is refuse
    classify_output: tuple[SafetyRuleSnap, ...]  # classifier rules whose action is stop


def compile_pack(pack: PolicyPackSnap) -> CompiledPack:
    """Compile a valid pack (:func:`runtime.safety.rules.validate_pack` is empty for it)."""

    def rules(action: str) -> tuple[SafetyRuleSnap, ...]:
        return tuple(r for r in pack.rules if r.action == action and r.kind != "classifier")

    def classifiers(action: str) -> tuple[SafetyRuleSnap, ...]:
        return tuple(r for r in pack.rules if r.action == action and r.kind == "classifier")

    return CompiledPack(
        name=pack.name,
        version=pack.version,
        refuse=Matcher(pack.name, rules("refuse")),
        redact=Matcher(pack.name, rules("redact")),
        stop=Matcher(pack.name, rules("stop")),
        classify_input=classifiers("refuse"),
        classify_output=classifiers("stop"),
    )


class PackCache:
    """Compiled packs by ``(name, version)``, the least recently used dropped past ``size``."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._packs: OrderedDict[tuple[str, int], CompiledPack] = OrderedDict()
        self.compiles = 0  # how many packs were compiled (tests, metrics)

    def get(self, pack: PolicyPackSnap) -> CompiledPack:
        key = (pack.name, pack.version)
        found = self._packs.get(key)
        if found is not None:
            self._packs.move_to_end(key)
            return found
        compiled = compile_pack(pack)
        self.compiles += 1
        self._packs[key] = compiled
        if len(self._packs) > self._size:
            self._packs.popitem(last=False)
        return compiled

    def packs_for(self, safety: SafetySnap, tenant: str, model: str) -> tuple[CompiledPack, ...]:
        """The compiled packs in force for a request: the tenant's, then the model's (once each)."""
        names = dict.fromkeys((*safety.tenants.get(tenant, ()), *safety.models.get(model, ())))
        return tuple(self.get(safety.packs[n]) for n in names if n in safety.packs)
