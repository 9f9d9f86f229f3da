"""The work of a turn does not grow with the runs in flight, up to the runs an engine
keeps (``bounded.RUNS_KEPT``): every run's model call is held until all the runs have
made theirs, so all of them are in flight at each turn, and the store's reads per turn
are counted. Within the bound, 4 runs or 64 read the same per turn; past it (a bound
lowered below the runs in flight, as the tail's 2,048 logs were below 3,000 runs),
each turn reads back what the others pushed out: the engine's per-run maps, the
tail's logs and the fold holder's states must all be as large as the runs a process
carries (benchmarks/bench_concurrency.py measures 3,000 and 10,000)."""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import FoldCache
from aaa_django.events.cache import MAX_ENTRIES
from aaa_django.events.tail import MAX_STREAMS, TailCachedStore
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Engine, InProcessBus, bounded
from aaa_django.tools import ToolHandler, ToolRegistry, tool

from .helpers import ReadCountingStore, arun

TURNS = 3
#: the bound the test lowers every per-run map to
BOUND = 64


def test_every_per_run_bound_holds_the_runs_an_engine_keeps():
    assert MAX_STREAMS == bounded.RUNS_KEPT
    for name in ("STARTED_KEPT", "ALGORITHMS_KEPT", "STEPPED_KEPT", "COMPLETIONS_KEPT"):
        assert getattr(bounded, name) >= bounded.RUNS_KEPT, name
    assert MAX_ENTRIES >= 4 * bounded.RUNS_KEPT  # (a few projections a run)


@tool(name="noop", inline=True)
def noop(i: int = 0) -> int:
    """Does nothing."""
    return i


def held_model(runs: int):
    """A model that holds each call until ``runs`` calls wait, then answers them all:
    every run is in flight at every turn. A tool call for each reply but the last."""
    waiting: list[asyncio.Future] = []

    async def model(request):
        loop = asyncio.get_running_loop()
        me = loop.create_future()
        waiting.append(me)
        if len(waiting) == runs:
            for f in waiting:
                f.set_result(None)
            waiting.clear()
        await me
        done = sum(1 for m in request.messages if m.role == "tool")
        return text("done") if done >= TURNS - 1 else tool_call("noop", i=done)

    return model


def reads_per_turn(runs: int, monkeypatch) -> float:
    for name in ("STARTED_KEPT", "ALGORITHMS_KEPT", "STEPPED_KEPT", "COMPLETIONS_KEPT"):
        monkeypatch.setattr(bounded, name, BOUND)
    store = ReadCountingStore()

    async def main() -> int:
        engine = Engine(
            store=TailCachedStore(store, max_streams=BOUND),
            bus=InProcessBus(),
            cache=FoldCache(max_entries=4 * BOUND),
            # (the runs' waits are woken by their ends, which this engine appends: no
            # poll of theirs, a read each, comes within the test however slow the
            # machine; what is counted is the turns' reads)
            poll_interval=3600,
        )
        async with engine:
            registry = ToolRegistry([noop])
            LLMHandler(FakeLLMClient(held_model(runs))).attach(engine)
            ToolHandler(registry).attach(engine)
            algo = ToolLoop(registry, max_turns=TURNS + 1)
            started = [await engine.start(algo, {"task": f"run {i}"}) for i in range(runs)]
            before = store.reads
            outcomes = await asyncio.gather(*(r.result() for r in started))
            assert {o.outcome for o in outcomes} == {"success"}, outcomes
            return store.reads - before

    return arun(main(), timeout=120) / (runs * TURNS)


@pytest.mark.parametrize("runs", [4, BOUND])
def test_a_turn_reads_as_much_with_many_runs_in_flight_as_with_few(runs, monkeypatch):
    few = reads_per_turn(4, monkeypatch)
    assert reads_per_turn(runs, monkeypatch) <= few + 0.1, (runs, few)


def test_past_the_bound_every_turn_reads_back_what_the_others_pushed_out(monkeypatch):
    within = reads_per_turn(BOUND, monkeypatch)
    past = reads_per_turn(2 * BOUND, monkeypatch)
    assert past > within + 0.5, (within, past)
