"""A delivery reads its run's RUNMETA once: the engine's step and the handlers (the
model's, the tools', the validation's) decide from one fold. The engine drops it when
it appends to the run itself, so a decision is never made on a view that misses the
engine's own writes."""

from __future__ import annotations

import contextvars
from collections import Counter

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.runtime import RUNMETA
from aaa_django.tools import ToolRegistry

from .helpers import arun, make_engine, types
from .scenarios import add, add_then_answer

#: the event being delivered in this context (None: outside any delivery)
delivering: contextvars.ContextVar[str | None] = contextvars.ContextVar("delivering", default=None)


@pytest.mark.parametrize("answers", [False, True], ids=["results-alone", "answered"])
def test_a_delivery_reads_its_runs_runmeta_once(monkeypatch, answers):
    """``answered`` (the in-process default): the step on a handler's result is taken
    in the request's delivery, before the result's append (``Engine.answer``), with
    one read of its own (the result in the view); the result's delivery then reads
    none. Either way one read per event."""
    reads: Counter[str | None] = Counter()
    read = RUNMETA._load  # (what ``load`` and ``load_info`` both do)

    async def counted(store, stream, cache, at):
        reads[delivering.get()] += 1
        return await read(store, stream, cache, at)

    monkeypatch.setattr(RUNMETA, "_load", counted)

    async def scenario():
        registry = ToolRegistry([add])
        async with make_engine(add_then_answer, registry, answers=answers) as engine:
            handle = engine.handle

            async def tagged(event):
                delivering.set(f"{event.seq}:{event.type}")
                await handle(event)

            monkeypatch.setattr(engine, "handle", tagged)
            await engine.start(ToolLoop(registry), {"task": "add 1 and 2"}, run_id="run-reads")
            await engine.drain(10)
            return await engine.store.read("run-reads")

    log = arun(scenario())
    assert types(log)[-1] == "aaa.run.completed" and "aaa.tool.completed" in types(log)
    delivered = {f"{e.seq}:{e.type}" for e in log}
    # every event was delivered, and each delivery read RUNMETA once (before: the model's
    # and the tool's requests were read again by their handlers, a tool's twice)
    expected = dict.fromkeys(delivered, 1)
    if answers:
        for e in log:
            if e.type in ("aaa.input.validated", "aaa.llm.completed", "aaa.tool.completed"):
                del expected[f"{e.seq}:{e.type}"]
                request = next(r for r in log if r.id == e.causation)
                expected[f"{request.seq}:{request.type}"] += 1
    assert {k: n for k, n in reads.items() if k is not None} == expected
