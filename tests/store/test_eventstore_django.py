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

from aaa_django.store import DjangoEventStore
from aaa_django.store.postgres import PgEventStore
from aaa_django.store.sqlite import SqliteEventStore
from aaa_django.testing.eventstore import Concurrently, EventStoreContract, run


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
