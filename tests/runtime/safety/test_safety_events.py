"""Intervention events: one per refusal / redacted rule / stop, and never any content."""

from __future__ import annotations

import msgspec
import pytest

from runtime.safety.compiled import compile_pack
from runtime.safety.events import Intervention, input_events, output_event
from runtime.safety.postfilter import StreamFilter
from runtime.safety.prefilter import Verdict, prefilter
from tests.runtime.safety.packs import pack, rule

pytestmark = pytest.mark.unit

WHO = {"tenant": "acme", "key": "abcd1234", "model": "tiny", "request_id": "r1", "at": 1.0}
SECRET = "jo.doe@example.com"


def test_redactions_refusals_and_stops_become_events_without_content() -> None:
    packs = (compile_pack(pack("p", 1,
        rule("pii", "pii", "redact", detectors=("email",)),
        rule("no", "terms", "refuse", terms=("launch codes",)),
        rule("out", "terms", "stop", terms=("bad",)))),)  # fmt: skip
    redacted = input_events(prefilter(packs, {"prompt": f"{SECRET} and {SECRET}"}), **WHO)
    assert redacted == [Intervention(stage="input", action="redact", pack="p", rule="pii",
                                     matches=2, **WHO)]  # type: ignore[arg-type]  # fmt: skip
    refused = input_events(prefilter(packs, {"prompt": "the Launch Codes"}), **WHO)
    assert [(e.action, e.rule) for e in refused] == [("refuse", "no")]
    assert input_events(prefilter(packs, {"prompt": "hello"}), **WHO) == []
    stream = StreamFilter(packs)
    stop = stream.feed("that is bad. ")
    assert stop is not None
    event = output_event(stop, **WHO)
    assert (event.stage, event.action, event.rule) == ("output", "stop", "out")
    raw = msgspec.json.encode([*redacted, *refused, event])
    assert SECRET.encode() not in raw
    assert b"Launch" not in raw


def test_a_classifier_that_failed_open_is_still_an_event() -> None:
    events = input_events(Verdict("pass", pack="c", rule="tox", failed="open"), **WHO)
    assert [(e.action, e.failed) for e in events] == [("pass", "open")]
