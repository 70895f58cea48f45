"""JSON logs: one object per record; the request line never carries prompt or completion."""

from __future__ import annotations

import json
import logging
import logging.config
import sys

import msgspec
import pytest

from runtime.telemetry.logging import (
    JsonFormatter,
    RequestRecord,
    log_request,
    logging_config,
)

pytestmark = pytest.mark.unit


def test_formatter_writes_one_json_object_with_fields() -> None:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "hello %s", ("you",), None)
    record.fields = {"request_id": "r1", "status": 200}
    document = json.loads(JsonFormatter().format(record))
    assert document["message"] == "hello you"
    assert document["level"] == "warning"
    assert document["request_id"] == "r1"
    assert document["status"] == 200


def _boom() -> None:
    raise RuntimeError("boom")


def test_formatter_includes_exceptions() -> None:
    try:
        _boom()
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "RuntimeError: boom" in json.loads(JsonFormatter().format(record))["exc"]


def test_request_record_has_no_room_for_text(caplog: pytest.LogCaptureFixture) -> None:
    names = {f.name for f in msgspec.structs.fields(RequestRecord)}
    assert not names & {"prompt", "messages", "completion", "content", "input", "body"}
    record = RequestRecord(request_id="r1", route="/v1/chat/completions", tenant="acme")
    record.timing("e2e", 0.0123)
    record.status = 503
    logger = logging.getLogger("switchyard.requests.test")
    with caplog.at_level(logging.INFO, logger="switchyard.requests.test"):
        log_request(logger, record)
    (entry,) = caplog.records
    assert entry.levelno == logging.WARNING  # 5xx stand out
    fields = entry.fields  # type: ignore[attr-defined]
    assert fields["class"] == ""
    assert fields["timings_ms"] == {"e2e": 12.3}
    assert "started" not in fields


def test_logging_config_is_a_valid_dict_config() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logging.config.dictConfig(logging_config("INFO"))
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
