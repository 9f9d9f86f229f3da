"""The Django ORM store passes the EventStore contract on SQLite and on PostgreSQL, and so
do the stores whose async calls run on connections of their own (PgEventStore,
SqliteEventStore).

Tests that start threads ask for pytest-django's ``transactional_db`` (through the
contract's ``concurrently`` fixture): each thread has its own connection, which must
see committed rows, and closes it when done.
"""

from __future__ import annotations

import pytest
from django.db import connections

from aaa_django.store import DjangoEventStore
from aaa_django.store.postgres import PgEventStore
from aaa_django.store.sqlite import SqliteEventStore
from aaa_django.testing.eventstore import Concurrently, EventStoreContract


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
