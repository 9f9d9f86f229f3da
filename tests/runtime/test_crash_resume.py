"""Crash and resume: drop the engine after any number of appended events; a new engine
on the same store finishes the run exactly as an uninterrupted one would, but for a
model call whose attempt was on the log, without its result, when the engine went: that
attempt is recorded abandoned (its process died with it in flight) and the call is
made again as attempt 2."""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import InMemoryEventStore
from aaa_django.llm.fake import text, tool_call
from aaa_django.tools import ToolRegistry, tool

from .helpers import CrashingStore, arun, check_resumed, make_engine, tool_messages, trace

RUN = "run-resume"
TURNS = 10


@tool(inline=True)
def noop(i: int) -> int:
    """Does nothing, fast."""
    return i


def ten_turns(request):
    n = tool_messages(request)
    return tool_call("noop", i=n) if n < TURNS - 1 else text(f"done after {n} tools")


REGISTRY = ToolRegistry([noop])


async def uninterrupted():
    async with make_engine(ten_turns, REGISTRY) as engine:
        run = await engine.start(ToolLoop(REGISTRY, max_turns=TURNS), {"task": "ten turns"}, run_id=RUN)
        outcome = await run.result(timeout=10)
        await engine.drain(5)
        return outcome, await engine.store.read(RUN)


async def crash_then_resume(k: int, *, answers: bool):
    store = InMemoryEventStore()
    crashing = CrashingStore(store, k)
    first = make_engine(ten_turns, REGISTRY, store=crashing, answers=answers)
    await first.start(ToolLoop(REGISTRY, max_turns=TURNS), {"task": "ten turns"}, run_id=RUN)
    done = asyncio.ensure_future(first.run(RUN).result())
    await asyncio.wait(
        {done, asyncio.ensure_future(crashing.crashed.wait())}, return_when=asyncio.FIRST_COMPLETED, timeout=10
    )
    await first.close(drain=False)  # the process is gone: nothing in flight survives
    done.cancel()
    cut = await store.read(RUN)
    at_crash = len(cut)
    # A model request goes with its first attempt, and (``answers``) a result with its
    # step's output: the log is cut between such groups, never inside one.
    assert k - (2 if answers else 1) <= at_crash <= k
    async with make_engine(ten_turns, REGISTRY, store=store) as second:
        adopted = await second.resume()
        outcome = await second.run(RUN).result(timeout=10)
        await second.drain(5)
        return adopted, outcome, await store.read(RUN), cut


REFERENCE = arun(uninterrupted())


def test_reference_run_is_ten_turns():
    outcome, log = REFERENCE
    assert outcome.value == {"text": f"done after {TURNS - 1} tools"}
    assert sum(e.type == "aaa.llm.requested" for e in log) == TURNS


@pytest.mark.parametrize("answers", [True, False], ids=["answered", "results-alone"])
@pytest.mark.parametrize("k", range(1, len(REFERENCE[1])))
def test_resume_after_crash_at_every_cut_point(k, answers):
    """``results-alone``: every result its own append (as on the Celery bus), so the
    log is cut between a result and the step on it too; ``answered`` (the in-process
    default): a result and its step's output are one append, so a crash leaves the log
    before the pair or after it, never between. (In both, a model request and its
    first attempt are one append.)"""
    ref_outcome, ref_log = REFERENCE
    adopted, outcome, log, cut = arun(crash_then_resume(k, answers=answers))
    assert adopted == [RUN]
    assert outcome == ref_outcome
    check_resumed(log, cut, ref_log, ordered=True)


def test_resume_leaves_finished_runs_alone():
    async def scenario():
        store = InMemoryEventStore()
        async with make_engine(ten_turns, REGISTRY, store=store) as engine:
            run = await engine.start(ToolLoop(REGISTRY, max_turns=TURNS), {"task": "x"}, run_id=RUN)
            await run.result(timeout=10)
        before = await store.read(RUN)
        async with make_engine(ten_turns, REGISTRY, store=store) as engine:
            assert await engine.resume() == []
            await engine.drain(5)
        assert trace(await store.read(RUN)) == trace(before)

    arun(scenario())
