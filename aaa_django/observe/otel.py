"""OpenTelemetry traces and metrics of runs: an engine observer (the ``otel`` extra).

Turned on by ``AAA["OTEL"] = True`` (every engine :func:`~aaa_django.site.engines.build_engine`
builds gets an :class:`OtelObserver`), or by hand: ``engine.observe(OtelObserver(engine))``.
It uses the process's tracer and meter providers (configure the SDK, its exporters and
sampler, before the engines are built) unless given its own.

**Spans** (instrumentation scope ``aaa_django``):

- ``aaa.run <algorithm>``: a run from its ``aaa.run.started`` to its
  ``aaa.run.completed``, emitted by the process that appends the completion (start and
  end times are the two events' times); ``aaa.outcome``, tokens and cost;
- ``aaa.step <algorithm>``: the algorithm's step for one event;
- ``chat <model>``: a model call (the ``aaa.llm.requested`` handler; the model the
  request names, else the one its client sends it to: ``AAA["LLM"]["MODEL"]``, an
  agent's own), with the GenAI semantic conventions: ``gen_ai.operation.name``,
  ``gen_ai.provider.name`` (and the older ``gen_ai.system``), ``gen_ai.request.model``,
  ``gen_ai.response.model``, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``;
- ``execute_tool <name>``: a tool call (``aaa.tool.requested``, and the granted
  approval that runs a gated call), ``gen_ai.tool.name``, ``gen_ai.tool.call.id``;
- ``aaa.handle <event type>``: any other handler (validation, ...).

Every span has ``aaa.run_id`` and the event's ``aaa.event.type`` / ``aaa.event.seq``.

**One run, one trace.** Every span of a run is a child of the run's span, whose
context (:class:`RunTrace`) is fixed when the run starts: in the trace of the span
that is current then (an HTTP request's, a parent run's step: a child run is in its
parent's trace), else in a trace of its own whose id is derived from the run id. The
Celery bus carries it in every delivery message (a W3C ``traceparent`` header), so
whichever worker delivers the run's events adds to that trace; a message without it
(a re-drive by the sweeper) falls back to the derived trace. The run span's own id is
derived from the run id, so the process that ends the run can emit it with the id its
children already name: that takes the SDK's tracer (``opentelemetry-sdk``), whose
``id_generator`` this observer's tracer gets wrapped (:func:`_choose_ids`).

**Metrics** (meter ``aaa_django``): ``aaa.runs.started`` (counter, by
``aaa.algorithm``), ``aaa.runs.ended`` (counter, by ``aaa.outcome``),
``gen_ai.client.token.usage`` (histogram, by ``gen_ai.token.type`` input/output and
model), ``aaa.cost`` (counter, USD, by model), ``aaa.handler.duration`` (histogram, s,
by ``aaa.event.type``), ``aaa.queue.lag`` (histogram, s: from an event's creation to
the start of its delivery, by ``aaa.event.type``).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util.types import AttributeValue

from aaa_django.events import Event
from aaa_django.llm import LLMHandler
from aaa_django.runtime.engine_api import EngineAPI
from aaa_django.runtime.event_types import (
    APPROVAL_GRANTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)
from aaa_django.runtime.observe import BaseObserver

SCOPE = "aaa_django"

#: (trace id, span id) the next span of this context gets (see :func:`_choose_ids`)
_chosen: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("aaa_otel_ids", default=None)


@dataclass(frozen=True, slots=True)
class RunTrace:
    """A run's place in tracing: its trace, its span's id, and the span it was
    started in (None: the run span is a root)."""

    trace_id: int
    span_id: int
    parent: int | None = None
    sampled: bool = True

    @classmethod
    def derived(
        cls, run_id: str, *, trace_id: int | None = None, parent: int | None = None, sampled: bool = True
    ) -> RunTrace:
        """The run's trace derived from its id (``trace_id``: another trace's)."""
        digest = hashlib.sha256(run_id.encode()).digest()
        own = int.from_bytes(digest[:16], "big") or 1
        return cls(trace_id or own, int.from_bytes(digest[16:24], "big") or 1, parent, sampled)

    def span_context(self) -> SpanContext:
        """The run span's context, as its children name it."""
        flags = TraceFlags(TraceFlags.SAMPLED if self.sampled else TraceFlags.DEFAULT)
        return SpanContext(self.trace_id, self.span_id, is_remote=True, trace_flags=flags)

    def headers(self) -> dict[str, str]:
        """W3C ``traceparent`` (the run span) and, when it has one, the span the run
        was started in (``aaa-run-parent``)."""
        out = {"traceparent": f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"}
        if self.parent is not None:
            out["aaa-run-parent"] = f"{self.parent:016x}"
        return out

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RunTrace | None:
        """What :meth:`headers` wrote, or None (missing or malformed)."""
        try:
            version, trace_id, span_id, flags = str(headers["traceparent"]).split("-")
            parent = headers.get("aaa-run-parent")
            found = cls(
                int(trace_id, 16), int(span_id, 16), int(parent, 16) if parent else None, bool(int(flags, 16) & 1)
            )
        except (KeyError, ValueError, TypeError, AttributeError):
            return None
        return found if version == "00" and found.trace_id and found.span_id else None


@runtime_checkable
class NamesProvider(Protocol):
    """A model client that says which provider it talks to (the provider clients do)."""

    provider: str


@runtime_checkable
class NamesModel(Protocol):
    """A model client that says which model a request naming none is sent to (the
    provider clients: their settings' ``MODEL``)."""

    model: str | None


@runtime_checkable
class RoutesAgents(Protocol):
    """A model client that sends an agent's requests to the agent's own model
    (:class:`~aaa_django.llm.routes.AgentModels`)."""

    def route(self, agent: str | None) -> object: ...


def _ns(event: Event) -> int:
    return int(event.time.timestamp() * 1e9)


class OtelObserver(BaseObserver):
    """Spans and metrics of ``engine``'s work (see the module docstring); also the
    Celery bus's carrier of a run's trace context (``headers`` / ``received``)."""

    def __init__(
        self,
        engine: EngineAPI,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        max_runs: int = 4096,
    ) -> None:
        from aaa_django import __version__

        self.engine = engine
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.tracer = provider.get_tracer(SCOPE, __version__)
        #: can the run span get the id its children name? (an SDK tracer: yes)
        self.chosen_ids = _choose_ids(self.tracer)
        meter = (meter_provider if meter_provider is not None else metrics.get_meter_provider()).get_meter(
            SCOPE, __version__
        )
        self.runs_started = meter.create_counter("aaa.runs.started", unit="{run}", description="Runs started")
        self.runs_ended = meter.create_counter("aaa.runs.ended", unit="{run}", description="Runs ended, by outcome")
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens a model call used"
        )
        self.cost = meter.create_counter("aaa.cost", unit="USD", description="What model calls cost")
        self.handler_duration = meter.create_histogram(
            "aaa.handler.duration", unit="s", description="A handler's call (a model or tool call)"
        )
        self.queue_lag = meter.create_histogram(
            "aaa.queue.lag", unit="s", description="From an event's creation to its delivery"
        )
        self.max_runs = max_runs
        self._runs: OrderedDict[str, RunTrace] = OrderedDict()
        self._lock = threading.Lock()
        #: request event id -> (its handler's span, the span's GenAI attributes)
        self._open: dict[str, tuple[Span, dict[str, AttributeValue]]] = {}
        #: per model client (by id): (its provider's name, whether it names its model);
        #: whether it routes agents' requests
        self._providers: dict[int, tuple[str, bool]] = {}
        self._routes: dict[int, bool] = {}

    # -- a run's trace ------------------------------------------------------------------

    def run_trace(self, run_id: str) -> RunTrace:
        """The run's trace as this process knows it (else derived from its id)."""
        with self._lock:
            found = self._runs.get(run_id)
        return found if found is not None else RunTrace.derived(run_id)

    def _remember(self, run_id: str, rt: RunTrace) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
            self._runs[run_id] = rt
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)

    def headers(self, event: Event) -> dict[str, str]:
        """What a delivery message of ``event`` carries: its run's trace context."""
        return self.run_trace(event.stream).headers()

    def received(self, run_id: str, headers: Mapping[str, str] | None) -> None:
        """A delivery message of run ``run_id`` arrived with ``headers``."""
        rt = RunTrace.from_headers(headers or {})
        if rt is not None:
            self._remember(run_id, rt)

    # -- the observer -------------------------------------------------------------------

    @contextlib.contextmanager
    def delivery(self, event: Event) -> Iterator[None]:
        self.queue_lag.record(max(0.0, time.time() - event.time.timestamp()), {"aaa.event.type": event.type})
        parent = trace.set_span_in_context(NonRecordingSpan(self.run_trace(event.stream).span_context()))
        token = otel_context.attach(parent)
        try:
            yield
        finally:
            otel_context.detach(token)

    def step(self, event: Event, algorithm: str) -> AbstractContextManager[Span]:
        return self.tracer.start_as_current_span(
            f"aaa.step {algorithm}",
            kind=SpanKind.INTERNAL,
            attributes={**_event_attributes(event), "aaa.algorithm": algorithm},
        )

    @contextlib.contextmanager
    def handler(self, handler: object, event: Event) -> Iterator[None]:
        name, kind, genai = self._describe(handler, event)
        started = time.perf_counter()
        with self.tracer.start_as_current_span(
            name, kind=kind, attributes={**_event_attributes(event), **genai}
        ) as span:
            self._open[event.id] = (span, genai)
            try:
                yield
            finally:
                self._open.pop(event.id, None)
                self.handler_duration.record(time.perf_counter() - started, {"aaa.event.type": event.type})

    def _describe(self, handler: object, event: Event) -> tuple[str, SpanKind, dict[str, AttributeValue]]:
        d = event.data
        if event.type == LLM_REQUESTED:
            client = self._client(handler, d.get("agent"))
            provider, default = self._names(client)
            genai: dict[str, AttributeValue] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.system": provider,
            }
            model = d.get("model") or default  # a request naming none goes to the client's model
            if model:
                genai["gen_ai.request.model"] = model
            return (f"chat {model}" if model else "chat"), SpanKind.CLIENT, genai
        if event.type in (TOOL_REQUESTED, APPROVAL_GRANTED):
            genai = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": str(d.get("name"))}
            if d.get("call_id"):
                genai["gen_ai.tool.call.id"] = str(d["call_id"])
            return f"execute_tool {d.get('name')}", SpanKind.INTERNAL, genai
        return f"aaa.handle {event.type}", SpanKind.INTERNAL, {}

    def _client(self, handler: object, agent: object) -> Any:
        """The model client that answers a request of ``agent`` (None: of no agent)."""
        client: Any = handler.client if isinstance(handler, LLMHandler) else None
        routes = self._routes.get(id(client))
        if routes is None:  # detected once per client
            routes = self._routes[id(client)] = isinstance(client, RoutesAgents)
        return client.route(agent if isinstance(agent, str) else None) if routes else client

    def _names(self, client: Any) -> tuple[str, str | None]:
        """(the provider's name, the model a request naming none is sent to) of a client."""
        known = self._providers.get(id(client))
        if known is None:  # detected once per client; its model read each time (a factory's is set late)
            provider = (
                client.provider
                if isinstance(client, NamesProvider)
                else (type(client).__name__ if client is not None else "unknown")
            )
            known = self._providers[id(client)] = (provider, isinstance(client, NamesModel))
        return known[0], client.model if known[1] else None

    async def appended(self, events: Sequence[Event]) -> None:
        for e in events:
            if e.type == RUN_STARTED:
                self._run_started(e)
            elif e.type in (LLM_COMPLETED, LLM_FAILED, TOOL_COMPLETED, TOOL_FAILED):
                self._result(e)
            elif e.type == RUN_COMPLETED:
                await self._run_ended(e)

    def _run_started(self, e: Event) -> None:
        algorithm = str(e.data.get("algorithm"))
        self.runs_started.add(1, {"aaa.algorithm": algorithm})
        current = trace.get_current_span().get_span_context()
        if current.is_valid:  # started in a span (a request, a parent run's step): its trace
            rt = RunTrace.derived(
                e.stream, trace_id=current.trace_id, parent=current.span_id, sampled=current.trace_flags.sampled
            )
        else:
            rt = RunTrace.derived(e.stream)
        self._remember(e.stream, rt)

    def _result(self, e: Event) -> None:
        opened = self._open.get(e.causation or "")
        d = e.data
        span, genai = opened if opened is not None else (None, {})
        if e.type == LLM_COMPLETED:
            usage = d.get("usage") or {}
            model = d.get("model")
            tokens_in, tokens_out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
            common = {k: v for k, v in genai.items() if k != "gen_ai.system"}
            if model:
                common["gen_ai.response.model"] = model
            self.tokens.record(tokens_in, {**common, "gen_ai.token.type": "input"})
            self.tokens.record(tokens_out, {**common, "gen_ai.token.type": "output"})
            cost = float(d.get("cost") or 0.0)
            if cost:
                self.cost.add(cost, {"gen_ai.response.model": str(model)})
            if span is not None:
                span.set_attributes(
                    {"gen_ai.usage.input_tokens": tokens_in, "gen_ai.usage.output_tokens": tokens_out, "aaa.cost": cost}
                )
                if model:
                    span.set_attribute("gen_ai.response.model", model)
        elif span is not None and e.type in (LLM_FAILED, TOOL_FAILED):
            reason = str(d.get("reason") or "error")
            span.set_attribute("error.type", reason)
            span.set_status(Status(StatusCode.ERROR, str(d.get("error") or reason)[:500]))

    async def _run_ended(self, e: Event) -> None:
        outcome = str(e.data.get("outcome"))
        self.runs_ended.add(1, {"aaa.outcome": outcome})
        started = await self.engine.started(e.stream)
        if started is None:
            return
        algorithm = str(started.data.get("algorithm"))
        rt = self.run_trace(e.stream)
        meta = await self.engine.meta(e.stream)
        attributes: dict[str, AttributeValue] = {
            "aaa.run_id": e.stream,
            "aaa.algorithm": algorithm,
            "aaa.outcome": outcome,
            "gen_ai.usage.input_tokens": meta.spend.tokens_in,
            "gen_ai.usage.output_tokens": meta.spend.tokens_out,
            "aaa.cost": meta.spend.cost,
        }
        if rt.parent is not None:
            parent = SpanContext(rt.trace_id, rt.parent, is_remote=True, trace_flags=rt.span_context().trace_flags)
            context = trace.set_span_in_context(NonRecordingSpan(parent))
        else:
            context = otel_context.Context()  # a root: not a child of whatever is current
        token = _chosen.set((rt.trace_id, rt.span_id))
        try:
            span = self.tracer.start_span(
                f"aaa.run {algorithm}",
                context=context,
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=_ns(started),
            )
        finally:
            _chosen.reset(token)
        if outcome != "success":
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end(end_time=max(_ns(e), _ns(started)))


def _event_attributes(event: Event) -> dict[str, AttributeValue]:
    return {"aaa.run_id": event.stream, "aaa.event.type": event.type, "aaa.event.seq": event.seq or 0}


def _choose_ids(tracer: trace.Tracer) -> bool:
    """Wrap the id generator of ``tracer`` (this observer's own scope, from an SDK
    tracer provider) so a span started while :data:`_chosen` is set gets those ids: the
    run span, emitted at the run's end, with the id its children were given from the
    start. ``id_generator`` is the SDK Tracer's public attribute and ``IdGenerator`` its
    public extension point (tests/observe/test_otel.py fails if either changes)."""
    try:
        from opentelemetry.sdk.trace import Tracer
        from opentelemetry.sdk.trace.id_generator import IdGenerator
    except ImportError:  # the API alone: spans go nowhere anyway
        return False
    if not isinstance(tracer, Tracer):
        return False
    if getattr(tracer.id_generator, "aaa_chosen", False):
        return True  # wrapped already (the provider keeps one tracer per scope)

    inner = tracer.id_generator

    class ChosenIds(IdGenerator):
        aaa_chosen = True

        def generate_span_id(self) -> int:
            chosen = _chosen.get()
            return chosen[1] if chosen is not None else inner.generate_span_id()

        def generate_trace_id(self) -> int:
            chosen = _chosen.get()
            return chosen[0] if chosen is not None else inner.generate_trace_id()

    tracer.id_generator = ChosenIds()
    return True
