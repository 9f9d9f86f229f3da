"""The conversation's folds: RUNMETA (status ``waiting``, questions, idle time), LOOP
(the message to answer, the reply sent), TALK and the model's CONVERSATION, folded in
any split of a conversation's log (and through a snapshot, or a copy), equal the
whole-log fold; and the run index, which folds on from its row (no questions kept),
agrees with RUNMETA on the status at every point."""

from __future__ import annotations

import copy

import pytest

from aaa_django.algos import LOOP, ToolLoop
from aaa_django.llm import CONVERSATION
from aaa_django.llm.fake import text, tool_calls
from aaa_django.runtime import RUNMETA
from aaa_django.runtime.conversation import TALK
from aaa_django.store import runindex
from aaa_django.store.rows import ROW_COLUMNS
from aaa_django.tools import ToolRegistry
from tests.runtime.helpers import arun, make_engine

from .test_engine import choose_city, echo

STATUS = ROW_COLUMNS.index("status")


def two_questions(request):
    """Asks two questions at once (two tool calls) on "which?", else says what it heard."""
    said = [m for m in request.messages if m.role == "user"]
    if said[-1].content == "which?" and request.messages[-1].role == "user":
        return tool_calls(("choose_city", {"why": "first"}), ("choose_city", {"why": "second"}))
    if request.messages[-1].role == "tool":
        return text("thanks: " + ", ".join(m.content for m in request.messages if m.role == "tool"))
    return echo([])(request)


def conversation_log() -> list:
    registry = ToolRegistry([choose_city])

    async def main():
        async with make_engine(two_questions, registry) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "hi"}, conversation={"idle": 60})
            await run.waiting(timeout=5)
            await run.say("which?")
            first, second = sorted((await run.waiting(timeout=5)).questions.items(), key=lambda q: q[1].seq)
            await run.answer(first[0], {"city": "Lyon"})
            meta = await run.meta()
            assert meta.status == "waiting" and meta.waits == 1  # the second is still open
            await run.answer(second[0], {"city": "Porto"})
            await run.waiting(timeout=5)
            await run.say("bye")
            await run.waiting(timeout=5)
            await run.close()
            await run.result(timeout=5)
            return await run.events()

    return arun(main())


LOG = None


def the_log() -> list:
    global LOG
    if LOG is None:
        LOG = conversation_log()
    return LOG


@pytest.mark.parametrize(
    "projection", [RUNMETA, LOOP, TALK, CONVERSATION], ids=["RUNMETA", "LOOP", "TALK", "CONVERSATION"]
)
def test_any_split_of_a_conversation_folds_to_the_whole_log_fold(projection):
    log = the_log()
    whole = projection.fold(log)
    for cut in range(len(log) + 1):
        head = projection.fold(log[:cut])
        assert projection.same(projection.fold(log[cut:], copy.deepcopy(head)), whole)
        if projection.snapshots:
            resumed = projection.parse(projection.dump(head))  # as a snapshot would
            assert projection.same(projection.fold(log[cut:], resumed), whole)
        assert projection.same(head, projection.fold(log[:cut]))  # the copy was independent


def test_the_run_index_folding_on_from_its_row_agrees_with_runmeta_on_the_status():
    log = the_log()
    seen = set()
    for cut in range(1, len(log)):
        row = runindex.initial_row(log[:1])
        row = runindex.row_after(row, log[1:cut]) if cut > 1 else row
        for rest in range(cut + 1, len(log) + 1):
            after = runindex.row_after(row, log[cut:rest])
            assert after[STATUS] == RUNMETA.fold(log[:rest]).status, (cut, rest)
            seen.add(after[STATUS])
    assert seen == {"running", "waiting", "completed"}


def test_the_log_goes_through_waiting_for_each_reply_and_both_questions():
    log = the_log()
    statuses = [RUNMETA.fold(log[:n]).status for n in range(1, len(log) + 1)]
    changes = [s for i, s in enumerate(statuses) if i == 0 or s != statuses[i - 1]]
    # hi -> reply (waiting) -> which? -> two questions (waiting until both answered)
    # -> reply (waiting) -> bye -> reply (waiting) -> closed
    assert changes == [
        "pending",
        "running",
        "waiting",
        "running",
        "waiting",
        "running",
        "waiting",
        "running",
        "waiting",
        "completed",
    ]
