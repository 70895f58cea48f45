"""Policy packs compiled for matching: a few combined scans per action, built once per version.

Each action of a pack (``refuse``, ``redact``, ``stop``) gets a :class:`Matcher`. All its terms
become one literal alternation (per case mode; Python's regex engine factors their common
prefixes and jumps to the characters a term can start with, an Aho-Corasick-like scan; the
rule is the matched term's dict entry, since a capturing group per term makes the engine ~50x
slower). Each pattern is its own regex: measured on a 1 KB chat text, a literal-prefixed
pattern costs ~1 us alone, while an alternation of seven costs ~14 us (the engine then tries
every branch at every position). Each PII detector is one regex starting with a character
class, skipped when the text cannot hold a match (no "@", too few digits). Word boundaries (terms,
detectors) and checksums (detectors) are checked on a candidate, and a rejected candidate is
retried one character on.

:class:`PackCache` keeps the compiled packs by ``(name, version)``: a new snapshot with the
same pack versions recompiles nothing. It is an object the gateway holds (no module state).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from runtime.safety.detectors import Detector, detectors_by_name
from runtime.safety.rules import DEFAULT_REGEX_MAX_LEN, MAX_MATCH_LEN
from runtime.snapshot import PolicyPackSnap, SafetyRuleSnap, SafetySnap


@dataclass(frozen=True, slots=True)
class Hit:
    pack: str
    rule: str
    label: str  # what a redaction writes: the detector's name, else the rule's id
    start: int
    end: int


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def pattern_width(pattern: str) -> int:
    """The longest match of ``pattern`` when it is bounded, else the default window."""
    try:
        parser: Any = getattr(re, "_parser")  # noqa: B009 - private, hence the fallback
        widest = int(parser.parse(pattern).getwidth()[1])
    except Exception:  # another Python's internals: be safe, not exact
        return DEFAULT_REGEX_MAX_LEN
    return widest if 0 < widest <= MAX_MATCH_LEN else DEFAULT_REGEX_MAX_LEN


_DELETE_DIGITS = str.maketrans("", "", "0123456789")
Span = tuple[int, int]


def _spans(
    regex: re.Pattern[str], hay: str, pos: int, keep: Callable[[int, int], bool]
) -> Iterator[Span]:
    """Non-overlapping matches of ``regex`` in ``hay`` that ``keep`` accepts; a rejected
    candidate is retried one character further on (so it hides nothing behind it)."""
    while True:
        m = regex.search(hay, pos)
        if m is None:
            return
        start, end = m.span()
        if keep(start, end):
            yield start, end
            pos = end if end > start else end + 1
        else:
            pos = start + 1


class _Terms:
    """Blocked terms of one case mode: one literal alternation (the regex engine factors
    common prefixes and skips to the possible first characters), the rule by term."""

    __slots__ = ("fallback", "folded", "regex", "rules")

    def __init__(self, rules: dict[str, str], *, folded: bool) -> None:
        self.rules = rules
        self.folded = folded
        body = "|".join(re.escape(t) for t in sorted(rules, key=len, reverse=True))
        self.regex = re.compile(body)
        # When lower() changes a text's length, positions would not map back: search the
        # text itself, case-insensitively (slower, and rare).
        self.fallback = re.compile(body, re.IGNORECASE) if folded else None

    def hits(self, text: str, pos: int, pack: str) -> Iterator[Hit]:
        hay, regex = text, self.regex
        if self.folded:
            hay = text.lower()
            if len(hay) != len(text):
                hay, regex = text, self.fallback or regex
        size = len(text)

        def keep(start: int, end: int) -> bool:
            if end == start:
                return False
            if _word(text[start]) and start > 0 and _word(text[start - 1]):
                return False
            return not (_word(text[end - 1]) and end < size and _word(text[end]))

        for start, end in _spans(regex, hay, pos, keep):
            found = hay[start:end]
            rule = self.rules.get(found.lower() if self.folded else found, "")
            rule = rule or next(iter(self.rules.values()))
            yield Hit(pack, rule, rule, start, end)


class Matcher:
    """The rules of one action of one pack, compiled for few, fast scans of a text.

    Terms: one literal alternation per case mode, over the lower-cased text for the
    case-insensitive ones. Patterns: one regex each (a pattern with a literal prefix is
    searched at memchr speed; an alternation of several loses that and is slower than all
    of them one by one). Detectors: one regex each, skipped when the text cannot hold one
    (no "@", too few digits), boundaries and checksums checked on a candidate.

    :meth:`maybe` is a cheaper test for short texts (the stream's window): one or two
    alternations of everything, without boundaries or checksums, so a False is certain.
    """

    __slots__ = (
        "_detectors",
        "_gates",
        "_patterns",
        "_terms",
        "active",
        "max_len",
        "pack",
    )  # fmt: skip

    def __init__(self, pack: str, rules: tuple[SafetyRuleSnap, ...]) -> None:
        self.pack = pack
        self.max_len = 1
        folded: dict[str, str] = {}
        exact: dict[str, str] = {}
        self._patterns: list[tuple[str, re.Pattern[str]]] = []
        self._detectors: list[tuple[Detector, re.Pattern[str], str]] = []
        table = detectors_by_name()
        for rule in rules:
            if rule.kind == "terms":
                for term in rule.terms:
                    target = exact if rule.case_sensitive else folded
                    target.setdefault(term if rule.case_sensitive else term.lower(), rule.id)
                    self.max_len = max(self.max_len, len(term))
            elif rule.kind == "regex":
                for pattern in dict.fromkeys(rule.patterns):
                    self._patterns.append((rule.id, re.compile(pattern)))
                    self.max_len = max(self.max_len, rule.max_len or pattern_width(pattern))
            elif rule.kind == "pii":
                for name in rule.detectors:
                    detector = table[name]
                    if all(d.name != name for d, _, _ in self._detectors):
                        self._detectors.append((detector, re.compile(detector.pattern), rule.id))
                    self.max_len = max(self.max_len, detector.max_len)
        gates = [(re.compile("|".join(re.escape(t) for t in folded)), True)] if folded else []
        loose = [*(re.escape(t) for t in exact), *(r.pattern for _, r in self._patterns),
                 *(d.pattern for d, _, _ in self._detectors)]  # fmt: skip
        if loose:
            gates.append((re.compile("|".join(f"(?:{x})" for x in loose)), False))
        self._gates: tuple[tuple[re.Pattern[str], bool], ...] = tuple(gates)
        # On equal spans the first one wins: a checksummed detector is the more specific.
        self._detectors.sort(key=lambda d: d[0].valid is None)
        self._terms = tuple(
            _Terms(t, folded=f) for t, f in ((folded, True), (exact, False)) if t
        )
        # Whether there is anything to match (the filters skip an empty matcher).
        self.active: bool = bool(self._terms or self._patterns or self._detectors)

    def hits(self, text: str, pos: int = 0) -> list[Hit]:
        """Every match in ``text`` from ``pos`` on, sorted by start (longest first); matches
        of different rules may overlap (:meth:`redact` keeps the first of overlapping ones)."""
        found: list[Hit] = []
        for terms in self._terms:
            found.extend(terms.hits(text, pos, self.pack))
        for rule, regex in self._patterns:
            for start, end in _spans(regex, text, pos, lambda s, e: e > s):
                found.append(Hit(self.pack, rule, rule, start, end))
        if self._detectors:
            digits = len(text) - len(text.translate(_DELETE_DIGITS))
            for detector, regex, rule in self._detectors:
                if digits < detector.min_digits or (detector.needs and detector.needs not in text):
                    continue
                found.extend(self._detector_hits(detector, regex, rule, text, pos))
        found.sort(key=lambda h: (h.start, -h.end))
        return found

    def _detector_hits(
        self, detector: Detector, regex: re.Pattern[str], rule: str, text: str, pos: int
    ) -> Iterator[Hit]:
        size = len(text)

        def keep(start: int, end: int) -> bool:
            if (start > 0 and _word(text[start - 1])) or (end < size and _word(text[end])):
                return False
            return detector.valid is None or detector.valid(text[start:end])

        for start, end in _spans(regex, text, pos, keep):
            yield Hit(self.pack, rule, detector.name, start, end)

    def maybe(self, text: str, pos: int = 0) -> bool:
        """False when :meth:`hits` would surely find nothing in ``text`` from ``pos`` on."""
        lowered = ""
        for regex, folded in self._gates:
            if folded:
                lowered = lowered or text.lower()
                if len(lowered) != len(text) or regex.search(lowered, pos) is not None:
                    return True
            elif regex.search(text, pos) is not None:
                return True
        return False

    def first(self, text: str, pos: int = 0) -> Hit | None:
        found = self.hits(text, pos)
        return found[0] if found else None

    def redact(self, text: str) -> tuple[str, list[Hit]]:
        """``text`` with every match replaced by ``[REDACTED:<label>]``, and the matches."""
        found = self.hits(text)
        if not found:
            return text, found
        pieces: list[str] = []
        kept: list[Hit] = []
        at = 0
        for hit in found:
            if hit.start < at:
                continue  # overlaps one already replaced
            pieces.append(text[at : hit.start])
            pieces.append(f"[REDACTED:{hit.label}]")
            at = hit.end
            kept.append(hit)
        pieces.append(text[at:])
        return "".join(pieces), kept


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
