"""Tracing: W3C traceparent handling, spans built from the stage marks, OTLP export from a
router process, and nothing at all while it is off."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest
from fixtures.router import World, routers, start_simulator
from fixtures.wait import eventually
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.tracing import Tracing, parse_traceparent

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (f"00-{TRACE}-{PARENT}-01".encode(), (TRACE, PARENT, True)),
        (f"00-{TRACE}-{PARENT}-00".encode(), (TRACE, PARENT, False)),
        (f"00-{TRACE.upper()}-{PARENT}-01".encode(), (TRACE, PARENT, True)),
        (None, None),
        (b"garbage", None),
        (f"00-{'0' * 32}-{PARENT}-01".encode(), None),
        (f"00-{TRACE}-{'0' * 16}-01".encode(), None),
        (f"01-{TRACE}-{PARENT}-01-extra".encode(), None),
    ],
)
def test_parse_traceparent(raw: bytes | None, expected: object) -> None:
    assert parse_traceparent(raw) == expected


def traced_request(tracing: Tracing, traceparent: bytes | None) -> RequestRecord:
    record = RequestRecord(request_id="req-1", route="/v1/chat/completions", stream=True)
    tracing.begin(record, traceparent)
    record.timing("auth", 0.001)
    record.timing("queue", 0.002)
    record.timing("upstream_ttft", 0.003)
    record.status, record.outcome, record.model, record.klass = 200, "ok", "m", "interactive"
    record.timing("e2e", 0.01)
    return record


def test_spans_follow_the_stages_and_the_incoming_trace() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(SimpleSpanProcessor(exporter))
    record = traced_request(tracing, f"00-{TRACE}-{PARENT}-01".encode())
    headers = tracing.upstream_headers(record)
    tracing.finish(record)

    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {
        "switchyard.request", "auth", "admission", "queue", "upstream_first_token", "stream",
    }  # fmt: skip
    root = spans["switchyard.request"]
    assert root.kind is SpanKind.SERVER
    assert root.parent is not None
    assert f"{root.parent.span_id:016x}" == PARENT
    assert all(f"{span.context.trace_id:032x}" == TRACE for span in spans.values())
    for name in ("auth", "admission", "queue", "upstream_first_token", "stream"):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == root.context.span_id
    upstream = spans["upstream_first_token"]
    assert upstream.kind is SpanKind.CLIENT
    assert headers == {"traceparent": f"00-{TRACE}-{upstream.context.span_id:016x}-01"}
    assert root.attributes is not None
    assert root.attributes["switchyard.request_id"] == "req-1"
    assert root.start_time is not None
    assert root.end_time is not None
    assert all(
        root.start_time <= (span.start_time or 0) <= (span.end_time or 0) <= root.end_time
        for span in spans.values()
    )
    assert record.fields()["trace_id"] == TRACE


def test_unsampled_incoming_trace_is_propagated_not_exported() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(SimpleSpanProcessor(exporter))
    record = traced_request(tracing, f"00-{TRACE}-{PARENT}-00".encode())
    assert tracing.upstream_headers(record)["traceparent"].endswith("-00")
    tracing.finish(record)
    assert exporter.get_finished_spans() == ()


def test_off_does_nothing() -> None:
    tracing = Tracing.from_env({})
    assert not tracing.enabled
    record = traced_request(tracing, f"00-{TRACE}-{PARENT}-01".encode())
    assert tracing.upstream_headers(record) == {}
    tracing.finish(record)
    assert record.marks == {}
    assert "trace_id" not in record.fields()


# -- a router process exporting over OTLP/HTTP ---------------------------------------------


class Collector(http.server.BaseHTTPRequestHandler):
    received: list[ExportTraceServiceRequest]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.received.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    received: list[ExportTraceServiceRequest] = []
    handler = type("Handler", (Collector,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_router_exports_request_spans_over_otlp(
    collector: tuple[str, list[ExportTraceServiceRequest]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    endpoint, received = collector
    sim = start_simulator("sim-chat")
    try:
        world = World()
        world.add_class("interactive", band=0)
        world.add_tenant("acme", classes=("interactive",), default_class="interactive")
        key = world.add_key("good", "acme")
        world.add_model("sim-chat", 1)
        world.add_endpoint(1, 1, sim.base_url)
        otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        var_dir = tmp_path_factory.mktemp("trace-router")
        with routers(world, var_dir, **otlp) as ([router], _):
            response = httpx.post(
                f"{router.base_url}/v1/chat/completions",
                json={
                    "model": "sim-chat",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                    "stream": True,
                },
                headers={
                    "Authorization": f"Bearer {key}",
                    "traceparent": f"00-{TRACE}-{PARENT}-01",
                },
                timeout=30,
            )
            assert response.status_code == 200

            def names() -> set[str]:
                return {
                    span.name
                    for request in received
                    for resource in request.resource_spans
                    for scope in resource.scope_spans
                    for span in scope.spans
                    if span.trace_id.hex() == TRACE
                }

            found = eventually(
                lambda: (
                    names() >= {"switchyard.request", "upstream_first_token", "stream"} and names()
                ),
                timeout=20.0,
                what="the request's spans at the OTLP collector",
            )
            assert {"auth", "admission", "queue"} <= found
    finally:
        sim.stop()
