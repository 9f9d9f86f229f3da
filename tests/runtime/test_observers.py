"""Engine observers (aaa_django.runtime.observe): every observer is told of appends; an
``Observer`` is also called around deliveries, steps and handlers, an
``AppendObserver`` (appends only: the site's signal sender, a process's run claims) is
not, and the engine wraps nothing around its work for it."""

from __future__ import annotations

import contextlib

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Engine
from aaa_django.runtime import observe as observe_module
from aaa_django.runtime.event_types import LLM_REQUESTED, RUN_COMPLETED, TOOL_REQUESTED
from aaa_django.runtime.observe import AppendObserver, BaseObserver, Observer
from aaa_django.signals import SignalSender
from aaa_django.site.holding import Claims
from aaa_django.tools import ToolHandler, ToolRegistry, tool

from .helpers import arun


@tool
def double(n: int) -> int:
    """Twice n."""
    return 2 * n


REGISTRY = ToolRegistry([double])


def model(request):
    if any(m.role == "tool" for m in request.messages):
        return text("done")
    return tool_call("double", n=21)


class Appends:
    """Told of appends only."""

    def __init__(self) -> None:
        self.types: list[str] = []

    async def appended(self, events) -> None:
        self.types += [e.type for e in events]


class Watches(BaseObserver):
    """Watches the work too."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.appends = 0

    def delivery(self, event):
        self.seen.append(("delivery", event.type))
        return contextlib.nullcontext()

    def step(self, event, algorithm):
        self.seen.append(("step", event.type))
        return contextlib.nullcontext()

    def handler(self, handler, event):
        self.seen.append(("handler", event.type))
        return contextlib.nullcontext()

    async def appended(self, events) -> None:
        self.appends += len(events)


async def _run(engine: Engine) -> str:
    LLMHandler(FakeLLMClient(model)).attach(engine)
    ToolHandler(REGISTRY).attach(engine)
    run = await engine.start(ToolLoop(REGISTRY), {"task": "double 21"})
    outcome = await run.result(timeout=10)
    await engine.drain()
    return outcome.outcome


def test_the_kind_of_an_observer_is_found_by_its_protocols():
    assert isinstance(Appends(), AppendObserver) and not isinstance(Appends(), Observer)
    assert isinstance(Watches(), Observer)
    # the site's own observers are told of appends only
    assert not isinstance(SignalSender(None), Observer) and isinstance(SignalSender(None), AppendObserver)
    assert not isinstance(Claims(None), Observer) and isinstance(Claims(None), AppendObserver)  # type: ignore[arg-type]


def test_an_append_observer_is_told_of_every_append_and_nothing_is_entered_for_it(monkeypatch):
    entered: list[object] = []
    real = observe_module.around

    def counting(observers, hook):
        entered.append(list(observers))
        return real(observers, hook)

    # the engine's parts import ``around`` by name: count what they enter
    import aaa_django.runtime.steps as steps_module

    monkeypatch.setattr(steps_module, "around", counting)
    appends = Appends()

    async def go():
        async with Engine(observers=[appends]) as engine:
            assert engine.watchers == []
            assert await _run(engine) == "success"
            return [e.type for e in await engine.store.read((await engine.store.streams())[0])]

    stored = arun(go())
    assert entered == []  # no step or handler was wrapped for it
    assert appends.types == stored  # told of each event once, in the order stored
    assert appends.types[-1] == RUN_COMPLETED


def test_an_observer_watches_deliveries_steps_and_handlers_beside_an_append_observer():
    appends, watches = Appends(), Watches()

    async def go():
        async with Engine(observers=[appends]) as engine:
            assert engine.observe(watches) is watches
            assert engine.watchers == [watches]
            assert await _run(engine) == "success"
            return await engine.store.read((await engine.store.streams())[0])

    stored = arun(go())
    assert watches.appends == len(stored) == len(appends.types)
    kinds = {kind for kind, _ in watches.seen}
    assert kinds == {"delivery", "step", "handler"}
    assert ("handler", LLM_REQUESTED) in watches.seen and ("handler", TOOL_REQUESTED) in watches.seen
    # every event the engine delivered was watched around its delivery: the run's end
    # among them, and no event it did not store
    delivered = [t for k, t in watches.seen if k == "delivery"]
    assert RUN_COMPLETED not in delivered or delivered.count(RUN_COMPLETED) == 1
    assert set(delivered) <= {e.type for e in stored} and LLM_REQUESTED in delivered


def test_an_object_without_appended_is_refused():
    class Nothing:
        def delivery(self, event):
            return contextlib.nullcontext()

    with pytest.raises(TypeError, match="not an engine observer"):
        Engine(observers=[Nothing()])  # type: ignore[list-item]
