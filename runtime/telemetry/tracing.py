"""OpenTelemetry traces of the request stages, exported over OTLP only when configured.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set;
then every request gets a trace: a ``switchyard.request`` server span with children ``auth``,
``admission``, ``queue``, ``upstream_first_token`` (a client span: the one the engine sees as
its parent) and ``stream``, carrying the request id, tenant, model, class and outcome. Off,
the router does no tracing work at all (one boolean check per hook) and sends no
``traceparent`` upstream.

The request path is not instrumented span by span. The gateway records stage timings anyway
(:class:`~runtime.telemetry.logging.RequestRecord`); while a request is traced it also notes
when each stage ended, and :meth:`Tracing.finish` builds the spans from those marks after the
response is done, handing them to the SDK's batch processor (a background thread exports).
Ids are chosen at :meth:`Tracing.begin` so the upstream request can carry a W3C
``traceparent`` naming the ``upstream_first_token`` span before that span exists. An incoming
``traceparent`` is honoured: same trace id, its span as parent, its sampled flag.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Mapping
from typing import Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from runtime.telemetry.logging import RequestRecord

_TRACEPARENT: Final = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_NO_HEADERS: Final[Mapping[str, str]] = {}
_SCOPE: Final = InstrumentationScope("switchyard.router")
ENDPOINT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def parse_traceparent(value: bytes | None) -> tuple[str, str, bool] | None:
    """(trace id, parent span id, sampled) from a W3C ``traceparent``; None if absent/invalid."""
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value.strip().lower())
    if match is None:
        return None
    trace_id, span_id, flags = (group.decode("ascii") for group in match.groups())
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


def _context(trace_id: str, span_id: str, sampled: bool) -> SpanContext:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=flags)


class Tracing:
    """The router's tracer. ``Tracing()`` is off; :meth:`from_env` turns it on when configured."""

    def __init__(
        self, processor: SpanProcessor | None = None, *, service_name: str = "switchyard-router"
    ) -> None:
        self.enabled = processor is not None
        self._processor = processor
        self._resource = Resource.create({"service.name": service_name})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tracing:
        env = os.environ if env is None else env
        if not any(env.get(name) for name in ENDPOINT_VARIABLES):
            return cls()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,  # only imported when tracing is configured
        )

        exporter: SpanExporter = OTLPSpanExporter()  # reads the OTEL_EXPORTER_OTLP_* variables
        return cls(
            BatchSpanProcessor(exporter),
            service_name=env.get("OTEL_SERVICE_NAME") or "switchyard-router",
        )

    def begin(self, record: RequestRecord, traceparent: bytes | None) -> None:
        """Give ``record`` its trace ids (from an incoming ``traceparent`` when valid)."""
        if not self.enabled:
            return
        incoming = parse_traceparent(traceparent)
        if incoming is None:
            record.trace_id, record.sampled = secrets.token_hex(16), True
        else:
            record.trace_id, record.parent_span_id, record.sampled = incoming
        record.span_id = secrets.token_hex(8)
        record.upstream_span_id = secrets.token_hex(8)

    def upstream_headers(self, record: RequestRecord) -> Mapping[str, str]:
        """The ``traceparent`` for the engine (empty while tracing is off)."""
        if not record.trace_id:
            return _NO_HEADERS
        flags = "01" if record.sampled else "00"
        return {"traceparent": f"00-{record.trace_id}-{record.upstream_span_id}-{flags}"}

    def finish(self, record: RequestRecord) -> None:
        """Build the request's spans from its stage marks and hand them to the exporter."""
        if not record.trace_id or not record.sampled or self._processor is None:
            return
        now_mono, now_ns = time.monotonic(), time.time_ns()

        def wall(mono: float) -> int:
            return now_ns - int((now_mono - mono) * 1e9)

        marks, timings = record.marks, record.timings_ms
        start = record.started
        end = marks.get("e2e", now_mono)
        root = _context(record.trace_id, record.span_id, True)
        parent = (
            _context(record.trace_id, record.parent_span_id, True)
            if record.parent_span_id
            else None
        )
        spans: list[tuple[str, float, float, str, SpanKind]] = []
        auth_end = marks.get("auth", start)
        spans.append(("auth", start, auth_end, secrets.token_hex(8), SpanKind.INTERNAL))
        first_byte = marks.get("upstream_ttft")
        if first_byte is not None:
            dispatched = first_byte - timings.get("upstream_ttft", 0.0) / 1000.0
            queued = dispatched - timings.get("queue", 0.0) / 1000.0
            spans.append(("admission", auth_end, queued, secrets.token_hex(8), SpanKind.INTERNAL))
            spans.append(("queue", queued, dispatched, secrets.token_hex(8), SpanKind.INTERNAL))
            spans.append(
                ("upstream_first_token", dispatched, first_byte, record.upstream_span_id,
                 SpanKind.CLIENT)
            )  # fmt: skip
            spans.append(("stream", first_byte, end, secrets.token_hex(8), SpanKind.INTERNAL))
        else:
            spans.append(("admission", auth_end, end, secrets.token_hex(8), SpanKind.INTERNAL))
        failed = record.status >= 500 or (record.outcome not in ("ok", "") and record.status < 400)
        status = Status(StatusCode.ERROR, record.outcome) if failed else Status(StatusCode.UNSET)
        attributes: dict[str, str | int | bool] = {
            "switchyard.request_id": record.request_id,
            "http.route": record.route,
            "http.response.status_code": record.status,
            "switchyard.outcome": record.outcome,
            "switchyard.tenant": record.tenant,
            "switchyard.model": record.model,
            "switchyard.class": record.klass,
            "switchyard.endpoint": record.endpoint,
            "switchyard.stream": record.stream,
        }
        self._processor.on_end(
            ReadableSpan(
                "switchyard.request",
                context=root,
                parent=parent,
                resource=self._resource,
                attributes=attributes,
                kind=SpanKind.SERVER,
                status=status,
                start_time=wall(start),
                end_time=wall(end),
                instrumentation_scope=_SCOPE,
            )
        )
        for name, began_at, ended_at, span_id, kind in spans:
            # Clamped into the request (timings are rounded to microseconds).
            began = min(max(began_at, start), end)
            ended = min(max(ended_at, began), end)
            self._processor.on_end(
                ReadableSpan(
                    name,
                    context=_context(record.trace_id, span_id, True),
                    parent=root,
                    resource=self._resource,
                    attributes={"switchyard.request_id": record.request_id},
                    kind=kind,
                    start_time=wall(began),
                    end_time=wall(ended),
                    instrumentation_scope=_SCOPE,
                )
            )

    def shutdown(self) -> None:
        """Flush and stop the exporter (router shutdown)."""
        if self._processor is not None:
            self._processor.shutdown()
