"""OpenTelemetry over the wire: a run's spans and metrics exported with the OTLP/HTTP
exporters (``opentelemetry-exporter-otlp-proto-http``) to a receiver this test starts,
which decodes each request with the OTLP protobuf messages (``opentelemetry-proto``),
as a collector would."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from aaa_django.algos import ToolLoop
from aaa_django.observe.otel import OtelObserver, RunTrace
from aaa_django.runtime.event_types import LLM_COMPLETED
from tests.runtime.helpers import arun, make_engine

from .test_otel import REGISTRY, model

#: path -> (request message, response message) of OTLP/HTTP
ROUTES = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
}


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: decodes each export request, keeps it, answers 200."""

    received: dict[str, list] = {}

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request_type, response_type = ROUTES[self.path]
        assert self.headers["Content-Type"] == "application/x-protobuf"
        self.received.setdefault(self.path, []).append(request_type.FromString(body))
        reply = response_type().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def receiver():
    Receiver.received = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", Receiver.received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def value(any_value):
    """The Python value of an OTLP ``AnyValue``."""
    return getattr(any_value, any_value.WhichOneof("value"))


def attributes(kvs) -> dict:
    return {kv.key: value(kv.value) for kv in kvs}


def test_a_runs_spans_and_metrics_reach_an_otlp_receiver(receiver):
    url, received = receiver
    session = requests.Session()
    session.trust_env = False  # straight to the receiver, whatever proxy the machine names
    resource = Resource.create({"service.name": "aaa-test"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{url}/v1/traces", session=session))
    )
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{url}/v1/metrics", session=session), export_interval_millis=3_600_000
    )  # exported at the flush
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])

    async def main():
        async with make_engine(model, REGISTRY) as engine:
            engine.observe(OtelObserver(engine, tracer_provider=tracer_provider, meter_provider=meter_provider))
            run = await engine.start(ToolLoop(REGISTRY, model="m-1"), {"task": "weather in Lyon?"})
            outcome = await run.result(timeout=10)
            await engine.drain()
            return run.run_id, outcome, await run.events()

    try:
        run_id, outcome, events = arun(main())
        assert tracer_provider.force_flush() and meter_provider.force_flush()
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
    assert outcome.outcome == "success"

    spans = [
        (attributes(rs.resource.attributes), span)
        for request in received["/v1/traces"]
        for rs in request.resource_spans
        for ss in rs.scope_spans
        if ss.scope.name == "aaa_django"
        for span in ss.spans
    ]
    assert {r["service.name"] for r, _ in spans} == {"aaa-test"}
    by_name: dict[str, list] = {}
    for _, span in spans:
        by_name.setdefault(span.name, []).append(span)
    # one trace, the run's, whose root is the run span
    trace_id = RunTrace.derived(run_id).trace_id.to_bytes(16, "big")
    assert {span.trace_id for _, span in spans} == {trace_id}
    [run_span] = by_name["aaa.run aaa.algos.ToolLoop"]
    assert run_span.span_id == RunTrace.derived(run_id).span_id.to_bytes(8, "big") and not run_span.parent_span_id
    assert attributes(run_span.attributes)["aaa.outcome"] == "success"
    # each model call a chat span with the GenAI attributes, as the log recorded it
    completed = [e for e in events if e.type == LLM_COMPLETED]
    chats = sorted(by_name["chat m-1"], key=lambda s: attributes(s.attributes)["aaa.event.seq"])
    assert [{k: v for k, v in attributes(s.attributes).items() if k.startswith("gen_ai.")} for s in chats] == [
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "fake",
            "gen_ai.system": "fake",
            "gen_ai.request.model": "m-1",
            "gen_ai.response.model": e.data["model"],
            "gen_ai.usage.input_tokens": e.data["usage"]["input_tokens"],
            "gen_ai.usage.output_tokens": e.data["usage"]["output_tokens"],
        }
        for e in completed
    ]
    assert {s.parent_span_id for s in chats} == {run_span.span_id}
    [tool_span] = by_name["execute_tool lookup"]
    assert attributes(tool_span.attributes)["gen_ai.tool.name"] == "lookup"

    metrics = {
        m.name: m
        for request in received["/v1/metrics"]
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    [ended] = metrics["aaa.runs.ended"].sum.data_points
    assert (ended.as_int, attributes(ended.attributes)) == (1, {"aaa.outcome": "success"})
    tokens = {
        attributes(p.attributes)["gen_ai.token.type"]: p.sum
        for p in metrics["gen_ai.client.token.usage"].histogram.data_points
    }
    assert tokens == {
        "input": sum(e.data["usage"]["input_tokens"] for e in completed),
        "output": sum(e.data["usage"]["output_tokens"] for e in completed),
    }
