"""Turns (``aaa_django.runtime.turns``): a process's deliveries take turns, the oldest
work first, so the run whose model answered first gets through its turn first; a
wait gives the turn away; no delivery holds one for long, so none can stall or
deadlock the others."""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import InMemoryEventStore
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime.event_types import LLM_REQUESTED, TOOL_REQUESTED
from aaa_django.runtime.turns import Turns, for_delivery
from aaa_django.tools import ToolRegistry, tool

from .helpers import arun, make_engine


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_work_caused_by_a_delivery_goes_before_newer_work_queued_earlier():
    turns = Turns(1)
    order: list[str] = []
    gates = {name: asyncio.Event() for name in ("x", "y")}
    children: list[asyncio.Task] = []

    async def child() -> None:
        async with turns.turn():
            order.append("x's child")

    async def delivery(name: str) -> None:
        async with turns.turn():
            async with turns.waiting():  # a model call
                await gates[name].wait()
            order.append(name)
            if name == "x":  # its result, delivered with x's stamp
                children.append(asyncio.get_running_loop().create_task(child(), context=for_delivery()))

    async def main() -> None:
        tasks = [asyncio.ensure_future(delivery(n)) for n in ("x", "y")]
        await settle()  # both wait on their calls, holding no turn
        async with turns.turn():  # someone else's work holds the only turn
            gates["x"].set()  # x's call answers first, then y's
            await settle()
            gates["y"].set()
            await settle()
            assert order == []
        await asyncio.gather(*tasks)
        await asyncio.gather(*children)

    arun(main())
    # x's child queued after y, yet goes first: its work became ready when x's call
    # answered, before y's did
    assert order == ["x", "x's child", "y"]
    assert turns.running == 0


def test_a_wait_gives_the_turn_to_the_next_delivery():
    turns = Turns(1)
    order: list[str] = []
    answer = asyncio.Event()

    async def calling() -> None:
        async with turns.turn():
            order.append("call starts")
            async with turns.waiting():
                await answer.wait()
            order.append("call answered")

    async def other() -> None:
        async with turns.turn():
            order.append("other")
            answer.set()

    async def main() -> None:
        first = asyncio.ensure_future(calling())
        await settle()
        await asyncio.gather(first, other())

    arun(main())
    assert order == ["call starts", "other", "call answered"]
    assert (turns.running, turns.forfeited) == (0, 0)


def test_a_delivery_that_keeps_its_turn_too_long_gives_it_up_and_nothing_deadlocks():
    # A holds the only turn and waits (not wrapped in waiting()) for B, which needs a
    # turn: after `hold` A's turn goes to B.
    turns = Turns(1, hold=0.01)
    b_done = asyncio.Event()

    async def a() -> str:
        async with turns.turn():
            await b_done.wait()
            return "a"

    async def b() -> str:
        async with turns.turn():
            b_done.set()
            return "b"

    async def main() -> list[str]:
        first = asyncio.ensure_future(a())
        await settle()
        return await asyncio.gather(first, b())

    assert arun(main(), timeout=10) == ["a", "b"]
    assert turns.forfeited == 1
    assert turns.running == 0


def test_a_cancelled_waiter_is_skipped_and_its_turn_not_lost():
    turns = Turns(1)
    ran: list[str] = []

    async def delivery(name: str) -> None:
        async with turns.turn():
            ran.append(name)

    async def main() -> None:
        async with turns.turn():
            start = asyncio.get_running_loop().create_task
            gone = start(delivery("cancelled"), context=for_delivery())
            kept = start(delivery("kept"), context=for_delivery())
            await settle()
            gone.cancel()
            await settle()
        await kept
        with pytest.raises(asyncio.CancelledError):
            await gone
        await delivery("after")

    arun(main())
    assert ran == ["kept", "after"]
    assert turns.running == 0


def test_a_turn_inside_a_turn_is_the_same_turn():
    turns = Turns(1)

    async def main() -> int:
        async with turns.turn():
            async with turns.turn():  # (the engine's handle inside a bus's delivery)
                return turns.running

    assert arun(main()) == 1


# -- in the engine: the run whose model answered first gets through its turn first --------


@tool
async def noop() -> str:
    """Does nothing, and waits a turn of the loop doing it: a wait (as a tool's call
    is), made of loop turns alone. (A sync tool runs in a thread, whose result comes
    back whenever the thread gets the GIL: the order the test asserts then depended on
    the thread's timing, and failed once in 50-400 runs.)"""
    await asyncio.sleep(0)
    return "ok"


def test_the_run_whose_model_answered_first_gets_through_its_turn_first():
    # One turn; the engine busy (the test holds the turn) while the three runs' models
    # answer, run-2 first, then run-0, then run-1 (by the turns' clock). Then the
    # runs' turns (a tool call, its result, the next request) go in that order: left
    # to the loop's order, or to plain first come, first served, run-2's tool call
    # would queue behind run-0's and run-1's answers.
    reg = ToolRegistry([noop])
    now = [0.0]
    turns = Turns(1, hold=3600, clock=lambda: now[0])
    gates: dict[str, asyncio.Future] = {}
    asked = asyncio.Event()
    appended: list[tuple[str, str]] = []

    class Recording(InMemoryEventStore):
        """Records the order of appends; an append waits, as a database's commit does
        (the memory store's never does: each delivery would run through alone)."""

        async def append(self, events, **kwargs):
            await asyncio.sleep(0)
            stored = await super().append(events, **kwargs)
            appended.extend((e.stream, e.type) for e in stored)
            return stored

    async def model(request):
        if not any(m.role == "tool" for m in request.messages):
            gate = gates[request.run_id] = asyncio.get_running_loop().create_future()
            if len(gates) == 3:
                asked.set()
            await gate
            return tool_call("noop")
        return text("done")

    async def main() -> list[str]:
        async with make_engine(model, reg, store=Recording(), turns=turns) as engine:
            runs = [await engine.start(ToolLoop(reg), {"task": f"run {i}"}, run_id=f"run-{i}") for i in range(3)]
            await asyncio.wait_for(asked.wait(), 10)
            async with turns.turn():
                for at, i in ((10.0, 2), (20.0, 0), (30.0, 1)):
                    now[0] = at
                    gates[f"run-{i}"].set_result(None)
                    await settle()  # its handler queues for a turn, stamped `at`
                assert turns.waiting_now == 3
            return [(await r.result(timeout=10)).outcome for r in runs]

    assert arun(main()) == ["success"] * 3

    def at(run: str, type: str, nth: int) -> int:
        return [i for i, a in enumerate(appended) if a == (run, type)][nth]

    # a run's turn: its tool call, the tool's result, and its next model request
    turn_ends = {r: at(r, LLM_REQUESTED, 1) for r in ("run-0", "run-1", "run-2")}
    turn_starts = {r: at(r, TOOL_REQUESTED, 0) for r in ("run-0", "run-1", "run-2")}
    # The turns end in the order the models answered; and run-2's (answered first) is
    # over before run-1's (answered last) starts, though run-1's answer queued before
    # run-2's tool call did. (The tool call itself is a wait: while it runs, the turn
    # goes to the next work in line, run-0's answer, so run-0's turn may start during
    # run-2's.)
    assert turn_ends["run-2"] < turn_ends["run-0"] < turn_ends["run-1"], appended
    assert turn_ends["run-2"] < turn_starts["run-1"], appended


def test_a_delivery_is_alone_only_when_it_is_all_the_turns_have_going():
    """``Turns.alone``: the current delivery holds the one turn held, none is queued,
    no wait is open (a model or tool whose answer would want the loop). Outside a
    delivery, or inside a wait, it is not (the engine's hint to its store: see
    ``caller_alone``)."""
    turns = Turns(2)
    seen: dict[str, bool] = {}
    answer, other_holds, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def waiting_run() -> None:  # a run whose model call is in flight
        async with turns.turn():
            async with turns.waiting():
                seen["inside its own wait"] = turns.alone()
                await answer.wait()
            seen["after its answer, alone again"] = turns.alone()

    async def other_run() -> None:
        async with turns.turn():
            other_holds.set()
            await release.wait()

    async def main() -> None:
        seen["outside a delivery"] = turns.alone()
        async with turns.turn():
            seen["the only delivery"] = turns.alone()
        waiter = asyncio.ensure_future(waiting_run())
        await settle()
        async with turns.turn():
            seen["beside a wait"] = turns.alone()
        answer.set()
        await waiter
        holder = asyncio.ensure_future(other_run())
        await other_holds.wait()
        async with turns.turn():
            seen["beside another turn"] = turns.alone()
        release.set()
        await holder

    async def queued_check() -> None:  # one turn held, one queued behind it
        one = Turns(1)

        async def next_delivery() -> None:
            async with one.turn():
                pass

        async with one.turn():
            behind = asyncio.get_running_loop().create_task(next_delivery(), context=for_delivery())
            await settle()
            seen["with one queued"] = one.alone()
        await behind

    arun(main())
    arun(queued_check())
    assert seen == {
        "outside a delivery": False,
        "the only delivery": True,
        "inside its own wait": False,
        "beside a wait": False,
        "after its answer, alone again": True,
        "beside another turn": False,
        "with one queued": False,
    }
    assert (turns.running, turns.waits) == (0, 0)
