"""Django signals of a run's life (aaa_django.signals), on SQLite and PostgreSQL, with
the in-process bus: sent after commit, by the process that appended, once per event.
(On Celery workers: tests/celery/test_observe.py.)"""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction

from aaa_django import signals
from aaa_django.algos import ToolLoop
from aaa_django.events import Event, FoldCache
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_calls
from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import APPROVAL_REQUESTED, RUN_STARTED
from aaa_django.site.engines import build_engine
from aaa_django.tools import ToolHandler, ToolRegistry, tool

pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)


@tool(requires_approval=True)
def gated(n: int = 0) -> str:
    """Waits for a person's approval."""
    return "approved"


REGISTRY = ToolRegistry([gated])


def model(request):
    if any(m.role == "tool" for m in request.messages):
        return text("done")
    return tool_calls(("gated", {"n": 1}))


class Received:
    """Receivers of the four signals: what each got, where it ran."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.calls: list[tuple[str, dict]] = []
        self.on_approval: list = []
        self.receivers = {}
        for name in ("run_started", "run_ended", "approval_requested", "event_appended"):
            self.receivers[name] = self._receiver(name)
            getattr(signals, name).connect(self.receivers[name], weak=False)

    def _receiver(self, name: str):
        def receive(sender, **kw):
            try:
                asyncio.get_running_loop()
                kw["on_a_loop"] = True
            except RuntimeError:
                kw["on_a_loop"] = False
            kw["thread"] = threading.get_ident()
            if name == "run_ended":  # the ORM is the receiver's to use; the end is committed
                kw["stored"] = EventRecord.objects.using(self.using).filter(stream=kw["run_id"]).count()
            self.calls.append((name, kw))
            for wake in self.on_approval if name == "approval_requested" else ():
                wake(kw)

        return receive

    def named(self, name: str) -> list[dict]:
        return [kw for n, kw in self.calls if n == name]

    def close(self) -> None:
        for name, receiver in self.receivers.items():
            getattr(signals, name).disconnect(receiver)


@pytest.fixture
def received(db_alias):
    r = Received(db_alias)
    yield r
    r.close()


def test_signals_follow_a_run_with_an_approval(db_alias, received):
    async def main():
        loop = asyncio.get_running_loop()
        asked: asyncio.Future = loop.create_future()
        received.on_approval.append(lambda kw: loop.call_soon_threadsafe(asked.set_result, kw))
        async with build_engine(using=db_alias, cache=FoldCache()) as engine:
            LLMHandler(FakeLLMClient(model)).attach(engine)
            ToolHandler(REGISTRY).attach(engine)
            run = await engine.start(ToolLoop(REGISTRY), {"task": "go"})
            request = await asyncio.wait_for(asked, 30)
            assert await engine.approve(run.run_id, request["request_id"], by="staff")
            outcome = await run.result(timeout=30)
            await engine.drain()
            return engine, run.run_id, outcome, await run.events()

    engine, run_id, outcome, events = async_to_sync(main)()

    assert outcome.outcome == "success"
    # every event once, in the log's order, each after its commit
    assert [kw["event"].id for kw in received.named("event_appended")] == [e.id for e in events]
    [started] = received.named("run_started")
    assert (started["run_id"], started["algorithm"], started["event"].type) == (
        run_id,
        "aaa.algos.ToolLoop",
        RUN_STARTED,
    )
    [asked] = received.named("approval_requested")
    request = next(e for e in events if e.type == APPROVAL_REQUESTED)
    assert (asked["request_id"], asked["tool"]) == (request.id, "gated")
    [ended] = received.named("run_ended")
    assert (ended["outcome"].outcome, ended["outcome"].value) == ("success", {"text": "done"})
    assert ended["stored"] == len(events)  # the end was committed when it was sent
    # receivers ran off the engine's event loop
    assert {kw["on_a_loop"] for _, kw in received.calls} == {False}


class Rollback(Exception):
    pass


def test_an_append_rolled_back_sends_nothing_and_a_committed_one_sends_after_commit(db_alias, received):
    engine = build_engine(using=db_alias, cache=FoldCache())

    async def append(event: Event) -> None:
        await engine.append([event])
        await engine.drain()

    with pytest.raises(Rollback):
        with transaction.atomic(using=db_alias):
            async_to_sync(append)(Event.new("signals-rolled-back", "test.thing.happened", {}))
            assert received.calls == []  # not before the commit
            raise Rollback
    assert received.calls == []  # nor ever: it was rolled back

    with transaction.atomic(using=db_alias):
        async_to_sync(append)(Event.new("signals-committed", "test.thing.happened", {"n": 1}))
        assert received.calls == []
    assert [(n, kw["event"].data) for n, kw in received.calls] == [("event_appended", {"n": 1})]
    async_to_sync(engine.close)()
