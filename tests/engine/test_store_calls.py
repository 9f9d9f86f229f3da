"""What a ToolLoop turn asks of the store (issue #19): the engine knows what it has
just appended (its tail), so a turn is its appends, and not one read of its own events.

A turn here is one model call and the tool call it asks for: four events, four
appends (``aaa.llm.requested``, ``aaa.llm.completed``, ``aaa.tool.requested``,
``aaa.tool.completed``), each one durable commit. The store is counted under the
engine's tail, so every call counted is one the database answers.
"""

from __future__ import annotations

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import FoldCache
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Engine
from aaa_django.store import DjangoEventStore
from aaa_django.tools import ToolHandler, ToolRegistry, tool
from tests.contracts.eventstore import run

TURNS = 10


class CountingStore:
    """An event store that records every call made to it: (method, stream)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.cache_key = inner.cache_key
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        async def counted(*args, **kwargs):
            first = args[0] if args else None
            stream = first if isinstance(first, str) else getattr(first, "stream", None)
            if stream is None and first:
                stream = first[0].stream
            self.calls.append((name, stream))
            return await method(*args, **kwargs)

        return counted

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)


@tool(inline=True)
def noop(i: int) -> int:
    """Does nothing."""
    return i


def model(request):
    done = sum(1 for m in request.messages if m.role == "tool")
    return text("done") if done >= TURNS - 1 else tool_call("noop", i=done)


async def toolloop_run(store) -> str:
    registry = ToolRegistry([noop])
    # The holder's self-check (a whole-log fold every N reads) is off: it is not part
    # of a turn (benchmarks/bench_toolloop.py reports its cost on its own).
    async with Engine(store=store, cache=FoldCache(check_every=0)) as engine:
        LLMHandler(FakeLLMClient(model)).attach(engine)
        ToolHandler(registry).attach(engine)
        started = await engine.start(ToolLoop(registry, max_turns=TURNS + 1), {"task": "count"})
        await engine.drain()  # every delivery done (not run.result(): it polls the store)
        calls = list(store.calls)
        outcome = await started.result()
    assert outcome.outcome == "success", outcome
    store.calls = calls
    return started.run_id


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_a_toolloop_turn_is_its_appends_and_no_read_of_them(db_alias):
    store = CountingStore(DjangoEventStore(db_alias))

    run(toolloop_run(store))

    appends = store.count("append")
    # The run's start, its input's validation, 4 events a turn (no tool call after
    # the last reply), its end: an append each.
    assert appends == 2 + 4 * TURNS - 2 + 1, store.calls
    assert len(store.calls) / TURNS <= 5
    # Every event of the run was appended by this engine: none is read back.
    assert store.count("read") == 0, store.calls
    assert {name for name, _ in store.calls} <= {"append", "save_snapshot"}
