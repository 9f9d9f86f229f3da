"""The fold holder's self-check never competes with a busy engine: checks that come
due while runs are in flight wait until the in-process bus is idle, then run."""

from __future__ import annotations

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


def script(request):
    n = tool_messages(request)
    return tool_call("noop", i=n) if n < TURNS - 1 else text("done")


REGISTRY = ToolRegistry([noop])


def test_self_checks_wait_for_an_idle_bus_and_then_pass():
    cache = FoldCache(check_every=5)
    busy_when_checking = []
    bus = InProcessBus()
    run_due = cache.run_due_checks

    async def watched_run_due():
        busy_when_checking.append(bus.pending - 1)  # deliveries besides this one
        return await run_due()

    cache.run_due_checks = watched_run_due

    async def body():
        engine = Engine(store=InMemoryEventStore(), bus=bus, cache=cache)
        LLMHandler(FakeLLMClient(script)).attach(engine)
        ToolHandler(REGISTRY).attach(engine)
        async with engine:
            run = await engine.start(ToolLoop(REGISTRY, max_turns=TURNS), {"task": "t"})
            outcome = await run.result(timeout=20)
            await engine.drain(10)
        return outcome

    outcome = arun(body())
    assert outcome.outcome == "success"
    assert cache.deferred  # the in-process bus took over running the checks
    assert cache.hits > 5 * 20  # hundreds of holder reads: checks came due often
    # Every batch of checks started on an idle bus, and they all ran and passed.
    assert busy_when_checking and set(busy_when_checking) == {0}
    assert cache.checks >= 1 and cache.resets == 0
    assert not cache.has_due()
