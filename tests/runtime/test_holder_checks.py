"""The fold holder's self-check runs only when the process is idle (spec 003): checks
that come due while a run is in flight wait until nothing has been read or folded for
``idle_after`` seconds, then run, pass, and leave nothing due. Time is the holder's
clock, moved by the test: what is asserted is what the holder decided."""

from __future__ import annotations

import asyncio

from aaa_django.algos import ToolLoop
from aaa_django.events import FoldCache, InMemoryEventStore
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Engine, InProcessBus
from aaa_django.tools import ToolHandler, ToolRegistry, tool

from .helpers import arun, tool_messages

TURNS = 30


@tool(inline=True)
def noop(i: int) -> int:
    """Does nothing, fast."""
    return i


#: set by the test: the last model call waits for it (the run is in flight, idle)
RELEASE: asyncio.Event | None = None


async def script(request):
    n = tool_messages(request)
    if n < TURNS - 1:
        return tool_call("noop", i=n)
    assert RELEASE is not None
    await RELEASE.wait()
    return text("done")


REGISTRY = ToolRegistry([noop])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_self_checks_wait_until_the_process_is_idle_and_then_pass():
    """A run of many turns makes checks come due; none runs while it works. Its last
    model call then waits (the process is idle: nothing read or folded); once the
    holder's clock has been quiet for ``idle_after`` the checks run and pass; the run
    then ends as it would have."""
    global RELEASE
    clock = Clock()
    cache = FoldCache(check_every=5, idle_after=15, clock=clock)
    cache.idle_poll = 0.01  # look often (real seconds): the clock alone says when it is idle
    bus = InProcessBus()

    async def body():
        global RELEASE
        RELEASE = asyncio.Event()
        engine = Engine(store=InMemoryEventStore(), bus=bus, cache=cache)
        LLMHandler(FakeLLMClient(script)).attach(engine)
        ToolHandler(REGISTRY).attach(engine)
        async with engine:
            run = await engine.start(ToolLoop(REGISTRY, max_turns=TURNS), {"task": "t"})
            for _ in range(2000):  # until the last model call waits
                await asyncio.sleep(0.005)
                log = await engine.store.read(run.run_id)
                if sum(e.type == "aaa.llm.requested" for e in log) == TURNS:
                    break
            await asyncio.sleep(0.05)  # the loop looks a few times: the clock has not moved
            seen = {"due": cache.has_due(), "busy": cache.checks}
            clock.now += 14.9  # not yet idle long enough
            await asyncio.sleep(0.05)
            seen["almost"] = cache.checks
            clock.now += 0.2  # 15.1 s without a read or a fold: idle
            for _ in range(200):
                await asyncio.sleep(0.01)
                if not cache.has_due() and not cache._running:
                    break
            await cache.wait_checks()
            seen["idle"], seen["resets"], seen["due_after"] = cache.checks, cache.resets, cache.has_due()
            RELEASE.set()
            outcome = await run.result(timeout=20)
        return outcome, seen

    outcome, seen = arun(body())
    RELEASE = None
    assert outcome.outcome == "success"
    assert cache.hits > 5 * 20  # hundreds of holder reads: checks came due often
    assert seen["due"] and seen["busy"] == seen["almost"] == 0  # none ran while there was work
    assert seen["idle"] >= 1 and seen["resets"] == 0  # once idle, they all ran and passed
    assert not seen["due_after"]


def test_the_checks_of_a_run_that_ended_go_with_its_states():
    clock = Clock()
    cache = FoldCache(check_every=5, idle_after=15, clock=clock)

    async def body():
        engine = Engine(store=InMemoryEventStore(), bus=InProcessBus(), cache=cache)
        LLMHandler(FakeLLMClient(quick)).attach(engine)
        ToolHandler(REGISTRY).attach(engine)
        async with engine:
            run = await engine.start(ToolLoop(REGISTRY, max_turns=TURNS), {"task": "t"})
            outcome = await run.result(timeout=20)
            await engine.drain(10)
        return outcome

    assert arun(body()).outcome == "success"
    assert cache.hits > 5 * 20 and cache.checks == 0
    assert not cache.has_due()  # the ended run's due checks were dropped with its states


def quick(request):
    n = tool_messages(request)
    return tool_call("noop", i=n) if n < TURNS - 1 else text("done")


def test_work_coming_back_stops_the_checks_and_the_rest_wait():
    clock = Clock()
    cache = FoldCache(check_every=1, idle_after=15, clock=clock)
    cache.idle_poll = 0.01
    ran: list[str] = []

    async def body():
        for name in ("a", "b", "c"):

            async def check(name=name):
                ran.append(name)
                cache.get(("k", name, "p", 1))  # a reader arrives while the first check runs

            cache.schedule_check(("k", name, "p", 1), check)
        clock.now += 16
        for _ in range(100):
            await asyncio.sleep(0.01)
            if ran:
                break
        await cache.wait_checks()
        await asyncio.sleep(0.05)
        return cache.has_due()

    still_due = asyncio.run(body())
    assert ran == ["a"] and still_due  # busy again after the first: b and c wait
