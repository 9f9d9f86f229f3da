"""The sweeper's ledger of re-drives (``aaa_django.celery.redrives``): a run it re-drove is
left to move before it is re-driven again, the wait doubling while the run does not
move, bounded; a run that moved is judged by its idle time alone. On every store: the
run index's columns (SQLite, PostgreSQL), this process's memory (the memory store).
The Celery side (a run whose messages wait in a queue, a lost re-drive, two sweeps at
once): tests/celery/test_sweeper.py."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from aaa_django.celery.redrives import (
    BACKOFF_LIMIT,
    DatabaseLedger,
    MemoryLedger,
    due_again,
    ledger_of,
)
from aaa_django.celery.sweeper import sweep
from aaa_django.events import FoldCache, InMemoryEventStore
from aaa_django.models import RunRecord
from aaa_django.runtime import Engine, InProcessBus
from aaa_django.store import DjangoEventStore
from tests.runtime import algos  # noqa: F401  (registers tests.reader: a run that waits)

pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)


def test_the_wait_after_a_re_drive_is_as_long_as_the_run_had_been_idle_and_bounded():
    S = 10.0
    assert due_again(0, None, S, S)  # never re-driven
    assert not due_again(0, S, 2 * S - 0.01, S) and due_again(0, S, 2 * S, S)
    assert not due_again(0, 2 * S, 4 * S - 0.01, S) and due_again(0, 2 * S, 4 * S, S)
    # bounded: a run idle for an hour when re-driven waits BACKOFF_LIMIT * S
    assert not due_again(0, 3600, 3600 + BACKOFF_LIMIT * S - 0.01, S)
    assert due_again(0, 3600, 3600 + BACKOFF_LIMIT * S, S)
    # moved since the re-drive: its idle time alone decides (the sweeper asked it)
    assert due_again(3601, 3600, 3601 + S, S)
    # stall_after 0 (re-drive everything now, as by hand): no wait
    assert due_again(0, 5, 5, 0)


@pytest.mark.parametrize("kind", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_run_that_does_not_move_is_re_driven_on_the_backoff(kind, request):
    """tests.reader waits for an event that never comes: a re-drive delivers its
    events again and it appends nothing, so it stays idle. Swept every second for 200 s
    of idleness (stall_after 10): re-driven at 10, 20, 40, 80, 160 s (one per sweep
    before the ledger)."""
    if kind == "postgres":  # skipped without PostgreSQL (bin/test starts it), failed under it
        request.getfixturevalue("pg_alias")
    store = {
        "memory": InMemoryEventStore,
        "sqlite": lambda: DjangoEventStore("default"),
        "postgres": lambda: DjangoEventStore("postgres"),
    }[kind]()

    async def scenario():
        async with Engine(store=store, bus=InProcessBus(), cache=FoldCache()) as engine:
            run = await engine.start("tests.reader", {}, run_id=f"run-{kind}")
            await engine.drain(5)
            last = (await engine.store.read(run.run_id))[-1].time.timestamp()
            redriven = []
            for k in range(10, 201):
                report = await sweep(engine, stall_after=10, now=last + k)
                await engine.drain(5)
                assert report.redriven + report.recent == [run.run_id], (k, report.summary())
                if report.redriven:
                    redriven.append(k)
            return redriven

    redriven = async_to_sync(scenario)()

    # S, then as long as it had been idle (2S, 4S, 8S), then every BACKOFF_LIMIT * S
    assert BACKOFF_LIMIT == 8 and redriven == [10, 20, 40, 80, 160]
    if kind == "memory":
        assert MemoryLedger.of(store).counts[f"run-{kind}"] == 5
    else:
        assert RunRecord.objects.using(store.using).get(pk=f"run-{kind}").redrives == 5
        assert isinstance(ledger_of(store), DatabaseLedger)


def test_the_memory_ledger_forgets_runs_that_ended():
    ledger = MemoryLedger()
    async_to_sync(ledger.claim)("a", None, 1.0)
    async_to_sync(ledger.claim)("b", None, 1.0)
    assert not async_to_sync(ledger.claim)("a", None, 2.0)  # someone re-drove it since
    ledger.keep(["b"])
    assert async_to_sync(ledger.seen)(["a", "b"]) == {"b": 1.0}
