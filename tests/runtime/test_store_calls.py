"""What a ToolLoop turn asks of the store: the engine knows what it has
just appended (its tail), so a turn is its appends, and not one read of its own events.

A turn here is one model call and the tool call it asks for: five events
(``aaa.llm.requested``, ``aaa.llm.attempted``, ``aaa.llm.completed``,
``aaa.tool.requested``, ``aaa.tool.completed``) in three appends on the in-process bus,
each one durable commit: the model call's attempt, on the log before it is sent; a
handler's result with what the run's step on it writes (``Engine.answer``: the model's
reply with the tool call it asks for, the tool's result with the next model request). The store is counted under the engine's tail, so every call counted is one
the database answers.
"""

from __future__ import annotations

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import FoldCache
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Engine
from aaa_django.store import DjangoEventStore
from aaa_django.store.postgres import PgEventStore, site_store
from aaa_django.store.sqlite import SqliteEventStore
from aaa_django.testing.eventstore import run
from aaa_django.tools import ToolHandler, ToolRegistry, tool

TURNS = 10


#: the EventStore protocol's calls
PROTOCOL = ("append", "read", "head", "load_snapshot", "save_snapshot", "erase", "streams")


def count_calls(store) -> list[tuple[str, str]]:
    """Record every protocol call made to ``store`` from now on, as (method, stream),
    in the list returned (the store object stays what it is: a bus can name it)."""
    calls: list[tuple[str, str]] = []

    def counted(name, method):
        async def call(*args, **kwargs):
            first = args[0] if args else None
            stream = first if isinstance(first, str) else getattr(first, "stream", None)
            if stream is None and first:
                stream = first[0].stream
            calls.append((name, stream))
            return await method(*args, **kwargs)

        return call

    for name in PROTOCOL:
        setattr(store, name, counted(name, getattr(store, name)))
    return calls


@tool(inline=True)
def noop(i: int) -> int:
    """Does nothing."""
    return i


def model(request):
    done = sum(1 for m in request.messages if m.role == "tool")
    return text("done") if done >= TURNS - 1 else tool_call("noop", i=done)


async def toolloop_run(store, calls: list) -> list:
    registry = ToolRegistry([noop])
    # The holder's self-check (a whole-log fold every N reads) is off: it is not part
    # of a turn (benchmarks/bench_toolloop.py reports its cost on its own).
    async with Engine(store=store, cache=FoldCache(check_every=0)) as engine:
        LLMHandler(FakeLLMClient(model)).attach(engine)
        ToolHandler(registry).attach(engine)
        started = await engine.start(ToolLoop(registry, max_turns=TURNS + 1), {"task": "count"})
        await engine.drain()  # every delivery done (not run.result(): it polls the store)
        made = list(calls)
        outcome = await started.result()
    assert outcome.outcome == "success", outcome
    return made


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_a_toolloop_turn_is_its_appends_and_no_read_of_them(db_alias):
    assert_a_turn_is_its_appends(DjangoEventStore(db_alias))


@pytest.mark.django_db(databases=["postgres"], transaction=True)
def test_a_toolloop_turn_on_the_async_store_is_its_appends_too(pg_alias):
    store = site_store(pg_alias)
    assert isinstance(store, PgEventStore)
    assert_a_turn_is_its_appends(store)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("own_thread", [True, False], ids=["own-thread", "on-loop"])
def test_a_toolloop_turn_on_the_sqlite_store_is_its_appends_too(own_thread):
    store = site_store("default")
    assert isinstance(store, SqliteEventStore)
    store.own_thread = own_thread
    assert_a_turn_is_its_appends(store)


def assert_a_turn_is_its_appends(store) -> None:
    calls = run(toolloop_run(store, count_calls(store)))

    methods = [name for name, _ in calls]
    # The run's start; then a result and what the step on it writes, an append each:
    # the input's verdict with the first model request (and its attempt: on the log
    # before it is sent), two a turn, the last reply with the run's end.
    assert methods.count("append") == 1 + 1 + 2 * (TURNS - 1) + 1, calls
    assert len(calls) / TURNS <= 6
    # Every event of the run was appended by this engine: none is read back.
    assert set(methods) <= {"append", "save_snapshot"}, calls
