"""Durable timers: the run index keeps each run's next due time (``RunRecord.due_at``),
folded from the log by the store's appends; :func:`aaa_django.celery.sweeper.fire_due` fires
what has come due and moves it on. Never late; a decided approval's expiry may linger
early until the next look settles it. On SQLite and PostgreSQL (their append paths
differ), and on PostgreSQL through the async store (the site's: its appends run the
same statements on connections of its own)."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from aaa_django.celery.sweeper import fire_due, sweep
from aaa_django.events import Event, FoldCache, InMemoryEventStore
from aaa_django.models import RunRecord
from aaa_django.runtime import Engine, InProcessBus
from aaa_django.runtime.event_types import (
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    decision_id,
    started_id,
)
from aaa_django.store import DjangoEventStore, runindex
from aaa_django.store.postgres import PgEventStore
from tests.runtime import algos  # noqa: F401  (registers tests.reader: a run that waits)

pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)


def approval(run_id: str, key: str, expires_at: float) -> Event:
    return Event(
        id=f"{run_id}-approval-{key}",
        stream=run_id,
        type=APPROVAL_REQUESTED,
        data={"tool_request_id": f"tool-{key}", "tool_request_seq": 1, "expires_at": expires_at},
    )


def decision(run_id: str, key: str) -> Event:
    request = f"{run_id}-approval-{key}"
    return Event(
        id=decision_id(request),
        stream=run_id,
        type=APPROVAL_GRANTED,
        data={"request_id": request, "tool_request_id": f"tool-{key}", "tool_request_seq": 1},
    )


@pytest.mark.parametrize(
    "db_alias, store",
    [("default", DjangoEventStore), ("postgres", DjangoEventStore), ("postgres", PgEventStore)],
    ids=["sqlite", "postgres", "postgres-async"],
    indirect=["db_alias"],
)
def test_the_index_holds_each_runs_next_due_time_and_the_duty_fires_it(db_alias, store):
    @sync_to_async
    def due() -> float | None:
        return RunRecord.objects.using(db_alias).get(pk="run-due").due_at

    async def scenario():
        seen = {}
        async with Engine(store=store(db_alias), cache=FoldCache()) as engine:
            if store is PgEventStore:
                assert engine.store.inner.pg is not None, "the async path is what this case tests"
            run = await engine.start("tests.reader", {}, deadline=600, run_id="run-due")
            deadline = (await run.meta()).deadline
            first, second = deadline - 540, deadline - 480
            seen["started"] = await due() == deadline
            await engine.append([approval("run-due", "a", first)])
            seen["approval"] = await due() == first
            await engine.append([decision("run-due", "a")])
            seen["decided"] = await due() == first  # the decided expiry lingers: early, never late
            seen["fired early"] = await fire_due(engine, now=first + 1), await due() == deadline
            await engine.append([approval("run-due", "b", second)])
            seen["fired expiry"] = await fire_due(engine, now=second + 1), await due() == deadline
            seen["before its time"] = await fire_due(engine, now=deadline - 1)
            seen["fired deadline"] = await fire_due(engine, now=deadline + 1), await due()
            seen["again"] = await fire_due(engine, now=deadline + 2)
            await engine.drain(5)
            return seen, deadline, await engine.store.read("run-due")

    seen, deadline, log = async_to_sync(scenario)()

    assert seen == {
        "started": True,
        "approval": True,
        "decided": True,
        "fired early": (["run-due"], True),  # nothing was due: moved on to the deadline
        "fired expiry": (["run-due"], True),
        "before its time": [],
        "fired deadline": (["run-due"], None),  # ended: no timer left
        "again": [],  # a second firing finds nothing, and would record nothing
    }
    types = [e.type for e in log]
    assert types.count(APPROVAL_EXPIRED) == 1 and types.count(RUN_COMPLETED) == 1
    (done,) = [e for e in log if e.type == RUN_COMPLETED]
    assert done.data == {"outcome": "timeout", "value": {"deadline": deadline}}


@pytest.mark.parametrize("db_alias", ["default", "postgres"], ids=["sqlite", "postgres"], indirect=True)
def test_a_rebuilt_index_is_exact(db_alias):
    now = time.time()
    store = DjangoEventStore(db_alias)
    started = Event(
        id=started_id("run-x"),
        stream="run-x",
        type=RUN_STARTED,
        data={"algorithm": "tests.reader", "input": {}, "deadline": now + 600},
    )
    store.append_sync([started, approval("run-x", "a", now + 60), decision("run-x", "a")])
    runindex.reindex(db_alias, ["run-x"])
    assert RunRecord.objects.using(db_alias).get(pk="run-x").due_at == now + 600


def test_a_run_waiting_for_a_person_is_not_stalled_and_its_expiry_fires_from_the_sweep():
    # The memory store has no due index: the sweep looks at each unfinished run instead.
    now = time.time()

    async def scenario():
        async with Engine(store=InMemoryEventStore(), bus=InProcessBus(), cache=FoldCache()) as engine:
            await engine.start("tests.reader", {}, run_id="run-w")
            await engine.drain(5)
            await engine.append([approval("run-w", "a", now + 60)])
            await engine.drain(5)
            waiting = await sweep(engine, stall_after=0, now=now + 30)
            expired = await sweep(engine, stall_after=0, now=now + 61)
            await engine.drain(5)
            return waiting, expired, [e.type for e in await engine.store.read("run-w")]

    waiting, expired, types = async_to_sync(scenario)()

    assert waiting.waiting == ["run-w"] and waiting.redriven == [] and waiting.fired == []
    assert expired.fired == ["run-w"] and types.count(APPROVAL_EXPIRED) == 1


@pytest.mark.parametrize("db_alias", ["default", "postgres"], ids=["sqlite", "postgres"], indirect=True)
def test_a_timer_firing_on_a_run_that_ended_elsewhere_is_dropped(db_alias):
    """Nothing is appended after a run's end, a timer's event neither: an approval's
    expiry fired from a view of the run read just before another process ended it
    (the race between the timer's read and its append) is refused by the store and
    dropped: no error, nothing recorded."""
    now = time.time()

    async def scenario():
        async with (
            Engine(store=DjangoEventStore(db_alias), cache=FoldCache()) as here,
            Engine(store=DjangoEventStore(db_alias), cache=FoldCache()) as there,
        ):
            await here.start("tests.reader", {}, run_id="run-c")
            await here.append([approval("run-c", "a", now + 60)])
            await here.drain(5)
            before = await here.meta("run-c")

            async def read_before_the_end(run_id):
                return before

            await there.cancel("run-c", reason="ended elsewhere")
            await there.drain(5)
            here.meta = read_before_the_end
            fired = await here.fire_due("run-c", now=now + 61)
            return before.due, fired, [e.type for e in await there.store.read("run-c")]

    pending, fired, types = async_to_sync(scenario)()

    assert pending == now + 60  # the firing engine saw the approval pending
    assert fired == []
    assert types[-1] == RUN_COMPLETED and APPROVAL_EXPIRED not in types
