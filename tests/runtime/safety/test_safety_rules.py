"""Policy packs as data: validation with field errors, compilation, the snapshot's new field."""

from __future__ import annotations

import msgspec
import pytest

from runtime.safety.compiled import PackCache, compile_pack
from runtime.safety.detectors import iban_ok, luhn_ok, ssn_ok
from runtime.safety.rules import pack_errors, validate_pack
from runtime.snapshot import SafetySnap, decode, encode
from runtime.testing.snapshots import SnapshotBuilder
from tests.runtime.safety.packs import pack, rule, twenty_rule_pack

pytestmark = pytest.mark.unit


def fields(errors: list[tuple[str, str]]) -> list[str]:
    return [f for f, _ in errors]


def test_the_twenty_rule_pack_is_valid() -> None:
    assert validate_pack(twenty_rule_pack()) == []
    assert pack_errors(msgspec.to_builtins(twenty_rule_pack())) == []


@pytest.mark.parametrize(
    ("bad", "field", "words"),
    [
        (rule("r", "regex", "refuse", patterns=("a(b",)), "rules[0].patterns[0]", "not a valid"),
        (rule("r", "regex", "refuse", patterns=("a*",)), "rules[0].patterns[0]", "empty string"),
        (rule("r", "regex", "refuse", patterns=("(?P<x>a)",)), "rules[0].patterns[0]", "named"),
        (rule("r", "regex", "refuse", patterns=(r"(a)\1",)), "rules[0].patterns[0]", "back-ref"),
        (rule("r", "regex", "refuse", patterns=("(?i)a",)), "rules[0].patterns[0]", "inline"),
        (rule("r", "regex", "refuse", patterns=("(a+)+b",)), "rules[0].patterns[0]", "exponential"),
        (rule("r", "regex", "refuse", patterns=(r"(?:x|\w*)*y",)), "rules[0].patterns[0]",
         "exponential"),
        (rule("r", "regex", "refuse", patterns=(r"(?:\d{2,}){3,}",)), "rules[0].patterns[0]",
         "exponential"),
        (rule("r", "regex", "refuse"), "rules[0].patterns", "empty pattern list"),
        (rule("r", "terms", "refuse"), "rules[0].terms", "empty term list"),
        (rule("r", "terms", "refuse", terms=("ok", "  ")), "rules[0].terms[1]", "blank"),
        (rule("r", "pii", "redact", detectors=("email", "dna")), "rules[0].detectors[1]",
         "unknown detector 'dna'"),
        (rule("r", "pii", "redact"), "rules[0].detectors", "at least one"),
        (rule("r", "classifier", "refuse", model="tox", threshold=1.5), "rules[0].threshold",
         "between 0 and 1"),
        (rule("r", "classifier", "refuse", model="tox", threshold=-0.1), "rules[0].threshold",
         "between 0 and 1"),
        (rule("r", "classifier", "refuse", threshold=0.5), "rules[0].model", "registered model"),
        (rule("r", "classifier", "redact", model="tox"), "rules[0].action", "refuse, stop"),
        (rule("r", "terms", "block", terms=("x",)), "rules[0].action", "refuse, redact, stop"),
        (rule("r", "words", "refuse"), "rules[0].kind", "unknown kind 'words'"),
        (rule("r", "terms", "refuse", terms=("x",), patterns=("y",)), "rules[0].patterns",
         "not used"),
        (rule("bad id!", "terms", "refuse", terms=("x",)), "rules[0].id", "letters"),
    ],
)  # fmt: skip
def test_malformed_rules_get_a_field_error(bad: object, field: str, words: str) -> None:
    errors = validate_pack(pack("p", 1, bad))  # type: ignore[arg-type]
    assert field in fields(errors), errors
    assert any(words in message for f, message in errors if f == field), errors


def test_pack_level_errors() -> None:
    two = rule("same", "terms", "refuse", terms=("x",))
    errors = validate_pack(pack(" ", 0, two, two))
    assert fields(errors) == ["name", "version", "rules[1].id"]


def test_a_document_of_the_wrong_shape_names_the_field() -> None:
    doc = {"name": "p", "version": 1,
           "rules": [{"id": "r", "kind": "classifier", "action": "refuse", "threshold": "hi"}]}
    assert pack_errors(doc) == [("rules[0].threshold", "Expected `float`, got `str`")]
    assert pack_errors({"name": "p"})[0][0] == "pack"
    assert pack_errors({"name": "p", "version": 1, "rules": [{"id": "r"}]})[0][0] == "rules[0]"


def test_checksums() -> None:
    assert luhn_ok("4111 1111 1111 1111")
    assert not luhn_ok("4111 1111 1111 1112")
    assert iban_ok("DE89 3704 0044 0532 0130 00")
    assert not iban_ok("DE88 3704 0044 0532 0130 00")
    assert ssn_ok("123-45-6789")
    assert not ssn_ok("666-45-6789")
    assert not ssn_ok("123-00-6789")


def test_a_pack_is_compiled_once_per_version() -> None:
    cache = PackCache()
    safety = SafetySnap(packs={"twenty": twenty_rule_pack()}, tenants={"acme": ("twenty",)},
                        models={"tiny": ("twenty", "gone")})  # fmt: skip
    first = cache.packs_for(safety, "acme", "tiny")
    again = cache.packs_for(safety, "acme", "tiny")
    assert [p.name for p in first] == ["twenty"]  # once, and an unknown name is skipped
    assert again[0] is first[0]
    assert cache.compiles == 1
    newer = SafetySnap(packs={"twenty": twenty_rule_pack(version=2)}, tenants=safety.tenants)
    assert cache.packs_for(newer, "acme", "other")[0].version == 2
    assert cache.compiles == 2
    assert cache.packs_for(newer, "nobody", "other") == ()


def test_terms_and_patterns_are_one_scan_each_and_the_rule_is_named() -> None:
    compiled = compile_pack(twenty_rule_pack())
    refuse = compiled.refuse
    assert len(refuse._terms) == 1  # every case-insensitive term of every refuse rule
    assert len(refuse._patterns) == 7  # one regex per pattern
    hit = refuse.first("please tell me how to BUILD A BOMB today")
    assert hit is not None
    assert (hit.rule, hit.label) == ("weapons", "weapons")
    assert refuse.first("a pipe bombastic remark") is None  # whole words only
    found = refuse.hits("x tag6:abcdef and code-12-5555 and blockedterm9x4 and sk-" + "Z" * 25)
    assert [h.rule for h in found] == ["regex-6", "regex-12", "terms-9", "secret-key"]


def test_case_modes_and_a_text_whose_lower_case_is_longer() -> None:
    matcher = compile_pack(pack("p", 1,
        rule("ci", "terms", "redact", terms=("Secret",)),
        rule("cs", "terms", "redact", terms=("ACME",), case_sensitive=True))).redact  # fmt: skip
    assert matcher.redact("a SECRET of Acme and ACME") == (
        "a [REDACTED:ci] of Acme and [REDACTED:cs]", matcher.hits("a SECRET of Acme and ACME"))
    # "İ".lower() is two characters: positions are kept by searching the text itself.
    text, hits = matcher.redact("İİ secret İ")
    assert text == "İİ [REDACTED:ci] İ"
    assert len(hits) == 1


def test_overlapping_matches_redact_once() -> None:
    matcher = compile_pack(pack("p", 1,
        rule("pii", "pii", "redact", detectors=("phone", "credit_card")))).redact  # fmt: skip
    text, hits = matcher.redact("pay 4111 1111 1111 1111 now")
    assert text == "pay [REDACTED:credit_card] now"
    assert [h.label for h in hits] == ["credit_card"]


def test_snapshots_without_safety_still_decode_and_round_trip() -> None:
    plain = SnapshotBuilder().add_tenant("acme").snapshot(version=3, created_at=1.0)
    raw = msgspec.json.decode(encode(plain))
    del raw["safety"]  # a document written before the field existed
    assert decode(msgspec.json.encode(raw)).safety == SafetySnap()
    safety = SafetySnap(packs={"twenty": twenty_rule_pack()}, tenants={"acme": ("twenty",)})
    safe = msgspec.structs.replace(plain, safety=safety)
    assert decode(encode(safe)) == safe
