"""The input pre-filter: refuse naming the rule only, redact into a copy, pass untouched."""

from __future__ import annotations

import copy
import json

import pytest

from runtime.safety.classify import classify
from runtime.safety.compiled import CompiledPack, compile_pack
from runtime.safety.prefilter import prefilter, refusal_body, text_parts
from tests.runtime.safety.packs import pack, rule, twenty_rule_pack

pytestmark = pytest.mark.unit

SECRET_TERM = "purple-elephant-protocol"


def packs() -> tuple[CompiledPack, ...]:
    tenant = pack("acme-policy", 3,
                  rule("secret", "terms", "refuse", terms=(SECRET_TERM,)),
                  rule("pii", "pii", "redact", detectors=("email", "credit_card")))  # fmt: skip
    model = pack("model-policy", 1, rule("codes", "regex", "redact", patterns=(r"XK-\d{4}",)))
    return compile_pack(tenant), compile_pack(model)


def chat(*contents: object) -> dict[str, object]:
    return {"model": "tiny", "stream": True, "temperature": 0.2,
            "messages": [{"role": "user", "content": c} for c in contents]}  # fmt: skip


def test_a_clean_request_passes_untouched() -> None:
    body = chat("hello there", [{"type": "text", "text": "all fine"}])
    verdict = prefilter(packs(), body)
    assert verdict.action == "pass"
    assert verdict.body is None


def test_a_refusal_names_the_pack_and_rule_never_the_text() -> None:
    body = chat("hi", [{"type": "image_url", "image_url": {"url": "x"}},
                       {"type": "text", "text": f"run the {SECRET_TERM.upper()} now"}])  # fmt: skip
    verdict = prefilter(packs(), body)
    assert (verdict.action, verdict.pack, verdict.rule) == ("refuse", "acme-policy", "secret")
    error = refusal_body(verdict)
    assert error["error"]["code"] == "content_policy_violation"
    assert "secret" in error["error"]["message"]
    assert SECRET_TERM not in json.dumps(error).lower()


def test_refuse_wins_over_redact() -> None:
    verdict = prefilter(packs(), chat(f"mail a@b.io the {SECRET_TERM}"))
    assert verdict.action == "refuse"


def test_redaction_rewrites_a_copy_across_parts_and_packs() -> None:
    body = chat("card 4111-1111-1111-1111 and XK-1234",
                [{"type": "text", "text": "write to jo.doe@example.com"},
                 {"type": "image_url", "image_url": {"url": "http://x/4111111111111111"}}],
                "nothing here")  # fmt: skip
    before = copy.deepcopy(body)
    verdict = prefilter(packs(), body)
    assert verdict.action == "redact"
    assert body == before  # the caller's document is not changed
    assert verdict.body is not None
    messages = verdict.body["messages"]
    assert messages[0]["content"] == "card [REDACTED:credit_card] and [REDACTED:codes]"
    assert messages[1]["content"][0]["text"] == "write to [REDACTED:email]"
    assert messages[1]["content"][1] == before["messages"][1]["content"][1]  # not text: kept
    assert messages[2] is body["messages"][2]  # untouched parts are shared, not copied
    assert {k: v for k, v in verdict.body.items() if k != "messages"} == {
        "model": "tiny", "stream": True, "temperature": 0.2}  # fmt: skip
    assert sorted(verdict.redacted) == [("acme-policy", "pii", 2), ("model-policy", "codes", 1)]


def test_a_card_number_failing_luhn_is_not_redacted() -> None:
    assert prefilter(packs(), chat("order 4111-1111-1111-1112")).action == "pass"


def test_completion_prompts_strings_and_lists() -> None:
    verdict = prefilter(packs(), {"model": "tiny", "prompt": ["a@b.io", [1, 2, 3], "ok"]})
    assert verdict.body == {"model": "tiny", "prompt": ["[REDACTED:email]", [1, 2, 3], "ok"]}
    single = prefilter(packs(), {"model": "tiny", "prompt": f"x {SECRET_TERM}"})
    assert single.action == "refuse"
    assert list(text_parts({"prompt": [1, 2]})) == []


def test_no_packs_pass() -> None:
    assert prefilter((), chat(SECRET_TERM)).action == "pass"


def test_the_twenty_rule_pack() -> None:
    compiled = (compile_pack(twenty_rule_pack()),)
    assert prefilter(compiled, chat("my key is sk-" + "a" * 30)).rule == "secret-key"
    assert prefilter(compiled, chat("see blockedterm3x2 here")).rule == "terms-3"
    redacted = prefilter(compiled, chat("call +1 415-555-1234 re code-4-12345"))
    assert redacted.body is not None
    assert redacted.body["messages"][0]["content"] == "call [REDACTED:phone] re [REDACTED:regex-4]"
    assert prefilter(compiled, chat("a perfectly ordinary question about zebras")).action == "pass"


class FakeClassifier:
    def __init__(self, scores: dict[str, float]) -> None:
        self.scores = scores
        self.calls: list[tuple[str, str]] = []

    async def score(self, model: str, text: str) -> float:
        self.calls.append((model, text))
        if model not in self.scores:
            raise ConnectionError(f"{model} is down")
        return self.scores[model]


def classifier_packs() -> tuple[CompiledPack, ...]:
    return (compile_pack(pack("c", 1,
        rule("tox", "classifier", "refuse", model="tox", threshold=0.8, fail_open=True),
        rule("jail", "classifier", "refuse", model="jail", threshold=0.5),
        rule("out", "classifier", "stop", model="tox", threshold=0.1))),)  # fmt: skip


@pytest.mark.asyncio
async def test_classifier_threshold() -> None:
    assert (await classify(classifier_packs(), "t", FakeClassifier({"tox": 0.79, "jail": 0.49}))
            ).action == "pass"  # fmt: skip
    verdict = await classify(classifier_packs(), "t", FakeClassifier({"tox": 0.8, "jail": 0.0}))
    assert (verdict.action, verdict.rule, verdict.failed) == ("refuse", "tox", "")
    out = await classify(classifier_packs(), "t", FakeClassifier({"tox": 0.2}), output=True)
    assert (out.action, out.rule) == ("refuse", "out")


@pytest.mark.asyncio
async def test_a_classifier_that_is_down_fails_open_or_closed_as_configured() -> None:
    opened = await classify(classifier_packs(), "t", FakeClassifier({"jail": 0.1}))
    assert (opened.action, opened.rule, opened.failed) == ("pass", "tox", "open")
    closed = await classify(classifier_packs(), "t", FakeClassifier({"tox": 0.1}))
    assert (closed.action, closed.rule, closed.failed) == ("refuse", "jail", "closed")
    assert "unavailable" in refusal_body(closed)["error"]["message"]
