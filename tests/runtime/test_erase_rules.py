"""Erasure: one rule (the engine's) for the admin and the API, and no orphan stream.

A run that has not ended is not erased (``RunNotEndedError``: cancel it, then erase
it). A tool still at work when its run ends, erased at once, finishes after the erase:
its result is refused, so the erased run leaves no stream whose first event is
``aaa.tool.failed``. On the memory, SQLite and PostgreSQL stores.
"""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.data import InMemoryBlobStore
from aaa_django.events import FoldCache, InMemoryEventStore
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import tool_call
from aaa_django.runtime import Engine, RunNotEndedError
from aaa_django.store import DjangoEventStore
from aaa_django.tools import ToolHandler, ToolRegistry, tool


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request):
    if request.param == "memory":
        return InMemoryEventStore()
    request.getfixturevalue("transactional_db")
    if request.param == "postgres":
        request.getfixturevalue("pg_alias")
    return DjangoEventStore({"sqlite": "default", "postgres": "postgres"}[request.param])


def stubborn_tool(seen: dict):
    """A tool that takes a while to stop when cancelled (it cleans up first)."""

    @tool
    async def stubborn() -> str:
        """Works, and cleans up when cancelled."""
        seen["started"].set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await seen["erased"].wait()  # still cleaning up when the run is erased
            raise
        return "done"

    return stubborn


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_a_run_erased_while_its_tool_stops_leaves_no_orphan_stream(store):
    async def scenario():
        seen = {"started": asyncio.Event(), "erased": asyncio.Event()}
        registry = ToolRegistry([stubborn_tool(seen)])
        engine = Engine(store=store, blobs=InMemoryBlobStore(), cache=FoldCache())
        LLMHandler(FakeLLMClient(lambda request: tool_call("stubborn"))).attach(engine)
        ToolHandler(registry).attach(engine)
        async with engine:
            run = await engine.start(ToolLoop(registry), {"task": "work"})
            await asyncio.wait_for(seen["started"].wait(), 10)
            with pytest.raises(RunNotEndedError, match="cancel it, then erase it"):
                await engine.erase(run.run_id)  # running: refused, nothing erased
            assert await engine.store.read(run.run_id)
            await run.cancel("stop")
            await run.result(timeout=10)
            erased = await engine.erase(run.run_id)  # ended: its tool still stopping
            seen["erased"].set()
            await engine.drain(10)
            return erased, await engine.store.read(run.run_id), await engine.store.streams(), run.run_id

    erased, left, streams, run_id = asyncio.run(scenario())
    assert erased > 0
    assert left == [] and run_id not in streams  # the tool's late result was refused
