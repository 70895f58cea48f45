"""Structured JSON logs: a formatter, and one line per request.

The request line carries identifiers, outcome, token counts and stage timings — never the
prompt or the completion (docs/design.md). Fields travel in ``record.fields`` (a dict) so the
formatter needs no knowledge of which logger wrote them.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import msgspec

_ENCODER = msgspec.json.Encoder()
REQUEST_LOGGER = "switchyard.requests"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then ``record.fields``."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            document.update(fields)
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(document).decode("utf-8")


def configure_json_logging(level: int | str = logging.INFO) -> None:
    """Send the root logger's records to stderr as JSON (replaces its handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class RequestRecord(msgspec.Struct, kw_only=True):
    """What is logged about one request (mutable while the request runs)."""

    request_id: str
    route: str
    tenant: str = ""
    api_key: str = ""  # the key's public prefix, never the secret
    model: str = ""
    version: str = ""
    endpoint: str = ""
    klass: str = ""
    stream: bool = False
    status: int = 0
    outcome: str = ""
    attempts: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    timings_ms: dict[str, float] = {}
    itl_ms: list[float] = []  # gaps between streamed events (per-version telemetry; not logged)
    started: float = msgspec.field(default_factory=time.monotonic)
    # Tracing (runtime/telemetry/tracing.py); all empty while tracing is off.
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""
    upstream_span_id: str = ""
    sampled: bool = False
    marks: dict[str, float] = {}  # stage -> monotonic time it ended (only while traced)

    def timing(self, stage: str, seconds: float) -> None:
        self.timings_ms[stage] = round(seconds * 1000.0, 3)
        if self.trace_id:
            self.marks[stage] = time.monotonic()

    def fields(self) -> dict[str, Any]:
        document = msgspec.to_builtins(self)
        document.pop("started", None)
        for name in ("marks", "parent_span_id", "upstream_span_id", "sampled", "itl_ms"):
            document.pop(name, None)
        if not self.trace_id:
            document.pop("trace_id", None)
            document.pop("span_id", None)
        document["class"] = document.pop("klass")
        return document  # type: ignore[no-any-return]


def log_request(logger: logging.Logger, record: RequestRecord) -> None:
    level = logging.WARNING if record.status >= 500 else logging.INFO
    if logger.isEnabledFor(level):  # the fields are built only for a line that is written
        logger.log(level, "request", extra={"fields": record.fields()})


def logging_config(level: str = "INFO") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` document: everything to stderr as JSON.

    For servers that configure logging in each worker process (uvicorn's ``log_config``).
    """
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            "uvicorn": {"level": level},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"level": "WARNING"},
        },
    }
