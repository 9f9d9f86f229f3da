"""A handler's result and the run's step on it in one append (``Engine.answer``).

On the in-process bus a model's reply, a tool's result and an input's verdict are
stepped on before they are appended, and go to the store with what the step wrote:
one append, one commit, where a result appended alone and stepped on when delivered
takes two. The log is the same either way, event for event; these tests hold it to
that, and to falling back to the result alone whenever the step cannot go with it.
"""

from __future__ import annotations

import functools

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import Event, InMemoryEventStore
from aaa_django.runtime import InProcessBus
from aaa_django.tools import ToolRegistry

from . import helpers, scenarios
from .helpers import arun, make_engine, trace, types
from .scenarios import EXPECTED, add, add_then_answer
from .test_double_delivery import comparable


class BatchStore(InMemoryEventStore):
    """The in-memory store, recording the types of each batch it stored."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def append(self, events, **kwargs):
        stored = await super().append(events, **kwargs)
        if stored:
            self.batches.append([e.type for e in stored])
        return stored


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_scenario_writes_the_same_log_as_with_results_appended_alone(name, monkeypatch):
    scenario = EXPECTED[name][0]
    answered = arun(scenario(False))
    monkeypatch.setattr(scenarios, "make_engine", functools.partial(helpers.make_engine, answers=False))
    alone = arun(scenario(False))
    assert comparable(answered.outcome) == comparable(alone.outcome)
    assert trace(answered.log) == trace(alone.log)
    for result in (answered, alone):
        assert result.engine.errors == [] and result.engine.bus.errors == []


def test_a_result_goes_with_what_the_step_on_it_writes():
    async def main(answers: bool) -> list[list[str]]:
        store = BatchStore()
        async with make_engine(add_then_answer, ToolRegistry([add]), store=store, answers=answers) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "add 1 and 2"}, run_id="run-a")
            assert (await run.result(timeout=10)).outcome == "success"
            await engine.drain(5)
        return store.batches

    # (each model call's attempt is on the log before it is sent: with its request)
    assert arun(main(True)) == [
        ["aaa.run.started"],
        ["aaa.input.validated", "aaa.llm.requested", "aaa.llm.attempted"],
        ["aaa.llm.completed", "aaa.tool.requested"],
        ["aaa.tool.completed", "aaa.llm.requested", "aaa.llm.attempted"],
        ["aaa.llm.completed", "aaa.run.completed"],
    ]
    alone = arun(main(False))
    assert [b for b in alone if len(b) > 1] == [["aaa.llm.requested", "aaa.llm.attempted"]] * 2
    assert all(len(batch) == 1 for batch in alone if batch[0] != "aaa.llm.requested")


class Foreign:
    """A model that, while it answers, has another process append to its run (an event
    this engine's tail does not hold): the held head is old when the result comes."""

    def __init__(self, store: InMemoryEventStore) -> None:
        self.store = store
        self.calls = 0

    async def __call__(self, request):
        self.calls += 1
        if self.calls == 1:
            await self.store.append(
                [
                    Event(
                        id=f"note-{self.calls}", stream=request.run_id, type="test.note", data={"by": "another process"}
                    )
                ]
            )
        return add_then_answer(request)


def test_a_result_whose_run_moved_on_is_appended_alone_and_stepped_on_when_delivered():
    async def main():
        store = BatchStore()
        model = Foreign(store)
        async with make_engine(model, ToolRegistry([add]), store=store) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "add 1 and 2"}, run_id="run-b")
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await store.read("run-b"), store.batches, engine

    outcome, log, batches, engine = arun(main())
    assert outcome.outcome == "success"
    assert types(log) == [
        "aaa.run.started",
        "aaa.input.validated",
        "aaa.llm.requested",
        "aaa.llm.attempted",
        "test.note",
        "aaa.llm.completed",
        "aaa.tool.requested",
        "aaa.tool.completed",
        "aaa.llm.requested",
        "aaa.llm.attempted",
        "aaa.llm.completed",
        "aaa.run.completed",
    ]
    # the reply found the log moved on (the note): it went alone, its step after it
    assert batches[3:5] == [["aaa.llm.completed"], ["aaa.tool.requested"]]
    assert batches[5:] == [
        ["aaa.tool.completed", "aaa.llm.requested", "aaa.llm.attempted"],
        ["aaa.llm.completed", "aaa.run.completed"],
    ]
    assert len({e.id for e in log}) == len(log) and engine.errors == []


def test_a_step_that_fails_on_a_result_ends_the_run_as_it_would_on_its_delivery():
    """The algorithm's own failure on the result is its outcome, appended with it."""
    from . import algos  # noqa: F401  (registers the test algorithms)

    async def main(answers: bool):
        store = BatchStore()
        async with make_engine(add_then_answer, ToolRegistry([add]), store=store, answers=answers) as engine:
            run = await engine.start("tests.explodes_on_result", {"task": "x"}, run_id="run-c")
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await store.read("run-c"), store.batches

    answered, alone = arun(main(True)), arun(main(False))
    assert answered[0].outcome == alone[0].outcome == "failed"
    assert "RuntimeError: boom on aaa.llm.completed" in answered[0].value["error"]
    assert trace(answered[1]) == trace(alone[1])
    assert answered[2][-1] == ["aaa.llm.completed", "aaa.run.completed"]


class Elsewhere:
    """A bus whose steps run elsewhere (a stand-in for the Celery bus: on the
    algorithm queue, in any worker): the in-process bus's deliveries, without its
    :class:`~aaa_django.runtime.bus.StepsInline` capability."""

    def __init__(self) -> None:
        self.inner = InProcessBus()

    def bind(self, engine) -> None:
        self.inner.bind(engine)

    async def publish(self, events) -> None:
        await self.inner.publish(events)

    def serial(self, key, *, contended=False, synced=False):
        return self.inner.serial(key, contended=contended, synced=synced)

    def spawn(self, coro) -> None:
        self.inner.spawn(coro)

    async def drain(self, timeout=None) -> None:
        await self.inner.drain(timeout)

    async def close(self, *, cancel=True) -> None:
        await self.inner.close(cancel=cancel)


def test_on_a_bus_whose_steps_run_elsewhere_every_result_is_appended_alone():
    async def main():
        store = BatchStore()
        async with make_engine(add_then_answer, ToolRegistry([add]), store=store, bus=Elsewhere()) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "add 1 and 2"}, run_id="run-d")
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, store.batches

    outcome, batches = arun(main())
    assert outcome.outcome == "success"
    # (a model request goes with its first attempt: this bus has no exclusive leases,
    # so the request's delivery is in this process; the Celery bus has them)
    assert [b for b in batches if len(b) > 1] == [["aaa.llm.requested", "aaa.llm.attempted"]] * 2
    assert len(batches) == 9


class FailingSnapshots(BatchStore):
    """A store whose snapshot saves fail (a bug, a full disk): they are derived data."""

    def __init__(self) -> None:
        super().__init__()
        self.tried = 0

    async def save_snapshot(self, snapshot):
        self.tried += 1
        raise RuntimeError("no room for snapshots")


def test_a_snapshot_the_step_on_a_result_would_save_that_fails_after_the_append_loses_nothing(monkeypatch):
    """The snapshots folded over a staged result are saved after its append, and after
    its deliveries are on their way: a save that fails costs a longer fold later, never
    the run."""
    from aaa_django.algos import LOOP

    monkeypatch.setattr(LOOP, "every", 2)

    async def main():
        store = FailingSnapshots()
        async with make_engine(add_then_answer, ToolRegistry([add]), store=store) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "add 1 and 2"}, run_id="run-f")
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, store.tried, engine

    outcome, tried, engine = arun(main())
    assert outcome.outcome == "success"
    assert tried >= 1 and engine.errors == [] and engine.bus.errors == []


def test_a_model_handler_told_not_to_records_each_attempt_in_an_append_of_its_own():
    async def main() -> list[list[str]]:
        from aaa_django.llm import FakeLLMClient, LLMHandler
        from aaa_django.runtime import Engine
        from aaa_django.tools import ToolHandler

        store = BatchStore()
        async with Engine(store=store) as engine:
            LLMHandler(FakeLLMClient(add_then_answer), attempt_with_request=False).attach(engine)
            ToolHandler(ToolRegistry([add])).attach(engine)
            run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "add 1 and 2"}, run_id="run-f")
            assert (await run.result(timeout=10)).outcome == "success"
            await engine.drain(5)
        return store.batches

    batches = arun(main())
    assert ["aaa.llm.attempted"] in batches and not any("aaa.llm.attempted" in b and len(b) > 1 for b in batches), (
        batches
    )
