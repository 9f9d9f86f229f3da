"""The Django ORM store passes the EventStore contract on SQLite and on PostgreSQL, and so
do the stores whose async calls run on connections of their own (PgEventStore,
SqliteEventStore).

Tests that start threads ask for pytest-django's ``transactional_db`` (through the
contract's ``concurrently`` fixture): each thread has its own connection, which must
see committed rows, and closes it when done.
"""

from __future__ import annotations

import asyncio

import pytest
from django.db import connections

from aaa_django.events import Event, KnowsRunning
from aaa_django.models import RunRecord
from aaa_django.store import DjangoEventStore
from aaa_django.store.postgres import PgEventStore
from aaa_django.store.sqlite import SqliteEventStore
from aaa_django.store.rows import SQLITE_CHUNK
from aaa_django.testing.eventstore import Concurrently, EventStoreContract, run
from tests.api.test_runindex import log_of


class DjangoStoreContract(EventStoreContract):
    alias = "default"

    def make_store(self, request):
        return DjangoEventStore(using=self.alias)

    def same_log(self, store):
        return DjangoEventStore(using=self.alias)

    def thread_done(self):
        connections.close_all()  # this thread's connections only

    @pytest.fixture
    def concurrently(self, transactional_db):
        return Concurrently(self.thread_done)

    # -- which runs still go (KnowsRunning: what the waits for runs' ends poll) -------

    def test_running_names_the_runs_started_and_not_ended(self, store):
        assert isinstance(store, KnowsRunning)
        done, going, starting = log_of("run-done", None), log_of("run-going", None), log_of("run-starting", None)
        for events in (done, going[:6], starting[:1]):
            run(store.append(events))
        run(store.append([Event.new("not-a-run", "test.e", {})]))
        run(store.append(log_of("run-erased", None)[:3]))
        run(store.erase("run-erased"))
        asked = ["run-done", "run-going", "run-starting", "not-a-run", "run-erased", "run-never", "run-going"]
        assert run(store.running(asked)) == {"run-going", "run-starting"}
        assert run(store.running([])) == set()

    def test_running_is_asked_of_more_runs_than_one_sqlite_statement_takes(self, store):
        for i in range(3):
            run(store.append(log_of(f"run-{i}", None)[:2]))
        asked = [f"run-none-{i}" for i in range(2 * SQLITE_CHUNK + 7)] + [f"run-{i}" for i in range(3)]
        assert run(store.running(asked)) == {"run-0", "run-1", "run-2"}

    def test_a_row_behind_its_log_does_not_keep_an_ended_run_going(self, store):
        """A row is caught up after the commit when it moved meanwhile: the log's newest
        event decides, as for the sweeper's question."""
        run(store.append(log_of("run-ended", None)))
        run(store.append(log_of("run-on", None)[:8]))
        RunRecord.objects.using(self.alias).filter(pk__in=["run-ended", "run-on"]).update(
            status="running", outcome=None, ended_at=None, last_seq=3
        )
        assert run(store.running(["run-ended", "run-on"])) == {"run-on"}


@pytest.mark.django_db(databases=["default"])
class TestDjangoEventStoreOnSQLite(DjangoStoreContract):
    alias = "default"


class OnPostgreSQL(DjangoStoreContract):
    """(Unmarked: a subclass's own ``django_db`` mark is the one pytest-django reads,
    where a marked base class's would win.)"""

    alias = "postgres"

    @pytest.fixture(autouse=True)
    def _postgres(self, pg_alias):
        """Skip (developer run) or fail (bin/test, CI) without the PostgreSQL service."""


@pytest.mark.django_db(databases=["postgres"])
class TestDjangoEventStoreOnPostgreSQL(OnPostgreSQL):
    pass


@pytest.mark.django_db(databases=["postgres"], transaction=True)
class TestDjangoEventStoreOnPostgreSQLOutsideATransaction(OnPostgreSQL):
    """Appends made outside any transaction (as a Celery worker's are) take the
    two-round-trip path: one query, then one statement for the events and the run
    index."""

    def test_the_test_runs_outside_a_transaction(self):
        assert not connections[self.alias].in_atomic_block


@pytest.mark.django_db(databases=["postgres"], transaction=True)
class TestPgEventStore(OnPostgreSQL):
    """The store whose async calls await psycopg's async connections (its own, so
    outside any transaction of the test's: ``transaction=True``)."""

    def make_store(self, request):
        store = PgEventStore(using=self.alias)
        assert store.pg is not None, "the async path is what this class tests"
        return store

    def same_log(self, store):
        return PgEventStore(using=self.alias)

    def test_racing_saves_of_one_snapshot_keep_the_newest(self, store):
        # One statement a save (an INSERT whose conflict updates only an older row):
        # saves of one key at once, from tasks on many connections and from another
        # store, each answered, none refused by the unique key or the trigger, and
        # the newest kept; a save is True only where it replaced an older one.
        other = self.same_log(store)
        seqs = [7, 3, 12, 5, 12, 9, 1, 11, 4, 10, 2, 8, 6]

        async def saves():
            return await asyncio.gather(
                *(
                    (store if i % 2 else other).save_snapshot(self.snap(seq, event_id=f"e{seq}"))
                    for i, seq in enumerate(seqs)
                )
            )

        saved = run(saves())
        assert all(type(ok) is bool for ok in saved), saved
        kept = run(store.load_snapshot("run-1", "test.tally", 1))
        assert (kept.seq, kept.event_id) == (12, "e12")
        assert [ok for ok, seq in zip(saved, seqs) if seq == 12].count(True) == 1  # the equal one: False


@pytest.mark.django_db(databases=["default"], transaction=True)
class TestSqliteEventStore(DjangoStoreContract):
    """The store whose async calls run on its own SQLite connection (outside any
    transaction of the test's: ``transaction=True``), on its thread and on the loop's."""

    @pytest.fixture(params=[True, False], ids=["own-thread", "on-loop"])
    def store(self, request):
        store = SqliteEventStore(using=self.alias, own_thread=request.param)
        assert store.db is not None, "its own connection is what this class tests"
        return store

    def same_log(self, store):
        return SqliteEventStore(using=self.alias, own_thread=store.own_thread)
