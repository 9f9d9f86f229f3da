"""OpenTelemetry (aaa_django.observe.otel), checked with the SDK's in-memory span
exporter and metric reader: a span per run, step, model call and tool call, all in one
trace; the GenAI attributes; the metrics. Across Celery workers:
tests/celery/test_observe.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from aaa_django.algos import ToolLoop
from aaa_django.llm.fake import text, tool_calls
from aaa_django.observe.otel import OtelObserver, RunTrace
from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)
from aaa_django.tools import ToolRegistry, tool
from tests.runtime.helpers import arun, make_engine

ROOT = Path(__file__).resolve().parents[2]


@tool
def lookup(city: str) -> str:
    """Looks a city up."""
    return f"{city}: 18C"


@tool
def broken(n: int = 0) -> str:
    """Always fails."""
    raise RuntimeError("the tool broke")


REGISTRY = ToolRegistry([lookup, broken])


def model(request):
    results = [m.content for m in request.messages if m.role == "tool"]
    if results:
        return text(f"it is {results[-1]}")
    task = next(m.content for m in request.messages if m.role == "user")
    return tool_calls(("broken", {"n": 1}) if "break" in task else ("lookup", {"city": "Lyon"}))


@pytest.fixture
def otel():
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[reader])
    yield tracer_provider, meter_provider, spans, reader
    tracer_provider.shutdown()
    meter_provider.shutdown()


def run_once(otel, task: str, *, within: str | None = None):
    tracer_provider, meter_provider, spans, reader = otel

    async def main():
        async with make_engine(model, REGISTRY) as engine:
            engine.observe(OtelObserver(engine, tracer_provider=tracer_provider, meter_provider=meter_provider))
            if within:
                with tracer_provider.get_tracer("the-site").start_as_current_span(within):
                    run = await engine.start(ToolLoop(REGISTRY, model="m-1"), {"task": task})
            else:
                run = await engine.start(ToolLoop(REGISTRY, model="m-1"), {"task": task})
            outcome = await run.result(timeout=10)
            await engine.drain()
            return run.run_id, outcome, await run.events()

    return arun(main())


def metric_points(reader) -> dict[str, list]:
    out: dict[str, list] = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def test_a_run_is_one_trace_of_steps_model_calls_and_tool_calls(otel):
    run_id, outcome, events = run_once(otel, "weather in Lyon?")
    spans = otel[2].get_finished_spans()

    assert outcome.outcome == "success"
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    [run_span] = by_name["aaa.run aaa.algos.ToolLoop"]
    assert run_span.parent is None  # started in no span: a trace of its own, derived from the run id
    assert (run_span.context.trace_id, run_span.context.span_id) == (
        RunTrace.derived(run_id).trace_id,
        RunTrace.derived(run_id).span_id,
    )
    # every other span is the run span's child, in its trace
    others = [s for s in spans if s is not run_span]
    assert {s.context.trace_id for s in others} == {run_span.context.trace_id}
    assert {s.parent.span_id for s in others} == {run_span.context.span_id}
    # a step per event the algorithm saw; two model calls, one tool call, validation
    steps = by_name["aaa.step aaa.algos.ToolLoop"]
    assert sorted(s.attributes["aaa.event.seq"] for s in steps) == sorted(
        e.seq for e in events if e.type not in (RUN_COMPLETED,) and s_for(e, steps)
    )
    chats = by_name["chat m-1"]
    completed = [e for e in events if e.type == LLM_COMPLETED]
    assert [
        (
            c.attributes["gen_ai.operation.name"],
            c.attributes["gen_ai.provider.name"],
            c.attributes["gen_ai.request.model"],
            c.attributes["gen_ai.response.model"],
            c.attributes["gen_ai.usage.input_tokens"],
            c.attributes["gen_ai.usage.output_tokens"],
        )
        for c in sorted(chats, key=lambda c: c.attributes["aaa.event.seq"])
    ] == [
        ("chat", "fake", "m-1", e.data["model"], e.data["usage"]["input_tokens"], e.data["usage"]["output_tokens"])
        for e in completed
    ]
    assert {c.kind for c in chats} == {trace.SpanKind.CLIENT}
    [tool_span] = by_name["execute_tool lookup"]
    request = next(e for e in events if e.type == TOOL_REQUESTED)
    assert (
        tool_span.attributes["gen_ai.tool.name"],
        tool_span.attributes["gen_ai.tool.call.id"],
        tool_span.attributes["aaa.event.seq"],
    ) == ("lookup", request.data["call_id"], request.seq)
    assert tool_span.status.status_code == StatusCode.UNSET
    # the run span covers the run and totals it
    spend = [e for e in events if e.type == LLM_COMPLETED]
    assert run_span.attributes["aaa.outcome"] == "success"
    assert run_span.attributes["gen_ai.usage.input_tokens"] == sum(e.data["usage"]["input_tokens"] for e in spend)
    assert run_span.start_time == int(events[0].time.timestamp() * 1e9)
    assert run_span.end_time == int(events[-1].time.timestamp() * 1e9)


def s_for(event, steps) -> bool:
    return any(s.attributes["aaa.event.seq"] == event.seq for s in steps)


def test_the_metrics_of_a_run(otel):
    run_id, outcome, events = run_once(otel, "weather in Lyon?")
    points = metric_points(otel[3])

    [started] = points["aaa.runs.started"]
    assert (started.value, dict(started.attributes)) == (1, {"aaa.algorithm": "aaa.algos.ToolLoop"})
    [ended] = points["aaa.runs.ended"]
    assert (ended.value, dict(ended.attributes)) == (1, {"aaa.outcome": "success"})
    completed = [e for e in events if e.type == LLM_COMPLETED]
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in points["gen_ai.client.token.usage"]}
    assert tokens == {
        "input": sum(e.data["usage"]["input_tokens"] for e in completed),
        "output": sum(e.data["usage"]["output_tokens"] for e in completed),
    }
    [cost] = points["aaa.cost"]
    assert cost.value == pytest.approx(sum(e.data["cost"] for e in completed))
    handled = {p.attributes["aaa.event.type"]: p.count for p in points["aaa.handler.duration"]}
    assert handled[LLM_REQUESTED] == 2 and handled[TOOL_REQUESTED] == 1
    lag = {p.attributes["aaa.event.type"]: p.count for p in points["aaa.queue.lag"]}
    assert sum(lag.values()) == len(events)  # one delivery per event, in process


def test_a_run_started_in_a_span_joins_its_trace(otel):
    run_id, outcome, events = run_once(otel, "weather in Lyon?", within="POST /runs")
    spans = otel[2].get_finished_spans()

    [request] = [s for s in spans if s.name == "POST /runs"]
    [run_span] = [s for s in spans if s.name.startswith("aaa.run ")]
    assert run_span.parent.span_id == request.context.span_id
    assert {s.context.trace_id for s in spans} == {request.context.trace_id}


def test_a_failed_tool_call_is_an_error_span(otel):
    run_id, outcome, events = run_once(otel, "break it")
    [tool_span] = [s for s in otel[2].get_finished_spans() if s.name == "execute_tool broken"]

    assert tool_span.status.status_code == StatusCode.ERROR
    assert tool_span.attributes["error.type"] == next(e for e in events if e.type == TOOL_FAILED).data["reason"]


def test_the_trace_context_a_message_carries():
    rt = RunTrace.derived("run-1", trace_id=0xABC, parent=0x42)
    back = RunTrace.from_headers(rt.headers())
    assert back == rt and rt.headers()["traceparent"].startswith("00-00000000000000000000000000000abc-")
    assert RunTrace.from_headers({"traceparent": "garbage"}) is None
    assert RunTrace.from_headers({}) is None


WITHOUT_OTEL = r"""
import importlib.abc, sys

class NoOtel(importlib.abc.MetaPathFinder):      # as if the extra were not installed
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r}")

if sys.argv[1] == "absent":
    sys.meta_path.insert(0, NoOtel())

import django
django.setup()
import asyncio
from django.core.checks import run_checks
from django.test import override_settings
from asgiref.sync import async_to_sync
from aaa_django.site.engines import build_engine
from aaa_django.events import InMemoryEventStore
from aaa_django.algos import ToolLoop
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text

async def main():
    async with build_engine(store=InMemoryEventStore()) as engine:
        LLMHandler(FakeLLMClient(lambda r: text("hi"))).attach(engine)
        run = await engine.start(ToolLoop(), {"task": "hi"})
        return (await run.result(timeout=10)).outcome

print(asyncio.run(main()))
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
with override_settings(AAA={"OTEL": True}):   # asked for: the extra must be there
    print([e.id for e in run_checks() if e.id.startswith("aaa.E")])  # (its errors)
"""


@pytest.mark.parametrize("extra, checks", [("absent", "['aaa.E050']"), ("installed", "[]")])
def test_without_otel_nothing_breaks_and_nothing_is_imported(extra, checks, tmp_path):
    script = tmp_path / "no_otel.py"
    script.write_text(WITHOUT_OTEL)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script), extra], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["success", "[]", checks]


def test_the_model_span_names_the_model_the_settings_or_an_agent_give(otel):
    """A request that names no model goes to its client's: the span is ``chat <that model>``
    with ``gen_ai.request.model``, for the site's client (``AAA["LLM"]["MODEL"]``) and
    for an agent's own model (behind ``AgentModels``)."""
    from aaa_django.algos import PydanticAIAgent
    from aaa_django.llm import LLMHandler
    from aaa_django.llm.openai_client import OpenAICompatibleClient
    from aaa_django.llm.pydantic_ai_client import PydanticAIClient
    from aaa_django.llm.routes import AgentModels
    from aaa_django.runtime import Engine
    from tests.field.model_server import ModelServer
    from tests.pydantic_ai import own_model

    tracer_provider, meter_provider, spans, _ = otel
    with ModelServer() as server:
        site = OpenAICompatibleClient(server.url + "/v1", "sk-test", "gpt-from-settings", max_retries=0)
        own = PydanticAIClient(own_model.agent.model, max_retries=0)

        async def main():
            async with Engine() as engine:
                LLMHandler(AgentModels(site, {"tests.pydantic_ai.own_model.agent": own})).attach(engine)
                engine.observe(OtelObserver(engine, tracer_provider=tracer_provider, meter_provider=meter_provider))
                for algorithm in (ToolLoop(tools=[]), PydanticAIAgent("tests.pydantic_ai.own_model:agent")):
                    outcome = await (await engine.start(algorithm, {"task": "hi"})).result(timeout=10)
                    assert outcome.outcome == "success", outcome
                await engine.drain()
            await site.aclose()

        arun(main())
    chats = sorted((s for s in spans.get_finished_spans() if s.name.startswith("chat")), key=lambda s: s.start_time)
    assert [(s.name, s.attributes["gen_ai.request.model"], s.attributes["gen_ai.provider.name"]) for s in chats] == [
        ("chat gpt-from-settings", "gpt-from-settings", "openai-compatible"),
        ("chat own-model", "own-model", "pydantic-ai"),
    ]
