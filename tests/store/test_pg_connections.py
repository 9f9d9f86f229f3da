"""The store's own PostgreSQL connections prepare their statements when nothing pools
them (``aaa_django.store.connections``): the alias's ``OPTIONS`` decide if they name a
``prepare_threshold``, an alias that says it is pooled (``DISABLE_SERVER_SIDE_CURSORS``)
or a connect a pooler answered (its own cancel key: another pid than the backend's)
prepares none."""

from __future__ import annotations

import os

import pytest

from aaa_django.events import Event
from aaa_django.runtime.event_types import RUN_STARTED
from aaa_django.store.connections import PREPARE_THRESHOLD, PgConnections, prepare_threshold
from aaa_django.store.postgres import PgEventStore
from aaa_django.testing.eventstore import ev, run

ALIAS = {"ENGINE": "django.db.backends.postgresql", "NAME": "db", "OPTIONS": {}}


@pytest.mark.parametrize(
    ("settings_dict", "key_pid", "expected"),
    [
        (ALIAS, 41, PREPARE_THRESHOLD),  # the backend's own key: nothing in between
        (ALIAS, 7, None),  # a pooler's key
        ({**ALIAS, "DISABLE_SERVER_SIDE_CURSORS": True}, 41, None),  # the site says it is pooled
        ({**ALIAS, "OPTIONS": {"prepare_threshold": None}}, 41, None),  # the site's word wins
        ({**ALIAS, "OPTIONS": {"prepare_threshold": 0}}, 7, 0),
        ({**ALIAS, "OPTIONS": {"prepare_threshold": 3}, "DISABLE_SERVER_SIDE_CURSORS": True}, 41, 3),
    ],
    ids=["direct", "pooler", "pooled-alias", "options-none", "options-zero", "options-over-alias"],
)
def test_the_threshold_a_connection_takes(settings_dict, key_pid, expected):
    assert prepare_threshold(settings_dict, key_pid, 41) == expected


def conns_with(alias: str, **changes) -> PgConnections:
    """The alias's connections, its settings changed for them alone."""
    conns = PgConnections(alias)
    settings_dict = dict(conns.django.settings_dict)
    options = dict(settings_dict.get("OPTIONS") or {})
    options.update(changes.pop("OPTIONS", {}))
    conns.django.settings_dict = {**settings_dict, **changes, "OPTIONS": options}
    return conns


class Recorded:
    """An append's steps (``appends.Steps``), the statements they send recorded."""

    def __init__(self, steps, sent: list[str]) -> None:
        self.steps, self.sent = steps, sent

    def __iter__(self):
        return self

    def __next__(self):
        return self._seen(next(self.steps))

    def send(self, value):
        return self._seen(self.steps.send(value))

    def throw(self, exc):
        return self._seen(self.steps.throw(exc))

    def close(self):
        self.steps.close()

    def _seen(self, step):
        self.sent.append(step[0])
        return step


def prepared_after_appends(conns: PgConnections, sent: list | None = None) -> tuple[int | None, list[str]]:
    """A run's appends, more than the threshold, one at a time on a store over
    ``conns`` (one connection, reused); then its threshold and what the server holds
    prepared for it. ``sent``: where the statements of the appends go."""
    store = PgEventStore(conns.using)
    store.pg = conns
    stream = f"run-prep-{id(conns)}"
    if sent is not None:
        steps = store._steps
        store._steps = lambda *args, **kwargs: Recorded(steps(*args, **kwargs), sent)  # type: ignore[method-assign]

    async def main():
        await store.append([Event.new(stream, RUN_STARTED, {"algorithm": "tests.Algo", "input": {}})])
        for _ in range(PREPARE_THRESHOLD + 3):
            await store.append([ev(stream)])
        async with conns.connection() as conn, conn.cursor() as cur:
            await cur.execute("SELECT statement FROM pg_prepared_statements")
            statements = [row[0] for row in await cur.fetchall()]
            threshold = conn.prepare_threshold
        await conns.close()
        return threshold, statements

    try:
        return run(main())
    finally:
        assert conns.opened == 1  # every call on the one connection


on_postgres = pytest.mark.django_db(databases=["postgres"], transaction=True)


@on_postgres
def test_a_direct_connection_prepares_the_statements_it_repeats(pg_alias):
    sent: list[str] = []
    threshold, statements = prepared_after_appends(PgConnections(pg_alias), sent)
    assert threshold == PREPARE_THRESHOLD
    assert any(s.startswith("WITH stored AS (INSERT INTO aaa_event") for s in statements), statements
    assert len(sent) == PREPARE_THRESHOLD + 4 and all(s.startswith("WITH stored AS") for s in sent)


@on_postgres
@pytest.mark.parametrize(
    "changes",
    [{"OPTIONS": {"prepare_threshold": None}}, {"DISABLE_SERVER_SIDE_CURSORS": True}],
    ids=["options-none", "pooled-alias"],
)
def test_an_alias_that_says_no_or_says_it_is_pooled_prepares_nothing(pg_alias, changes):
    """... and its appends of one event to a run are calls of the append function
    (migration 0009: its plans are the session's, nothing is named on the client)."""
    sent: list[str] = []
    threshold, statements = prepared_after_appends(conns_with(pg_alias, **changes), sent)
    assert threshold is None
    assert statements == []
    assert sent[0].startswith("WITH stored AS")  # the run's start: its events and its row
    assert len(sent) == PREPARE_THRESHOLD + 4
    assert all(s.startswith("SELECT aaa_append_event(") for s in sent[1:]), sent


@on_postgres
@pytest.mark.parametrize("options", [{}, {"application_name": "the-site"}], ids=["default", "the-sites"])
def test_the_server_names_a_store_connection_by_its_process_unless_the_site_names_it(pg_alias, options):
    from aaa_django.store.connections import application_name

    conns = conns_with(pg_alias, OPTIONS=options)

    async def main():
        async with conns.connection() as conn, conn.cursor() as cur:
            await cur.execute("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")
            (name,) = await cur.fetchone()
        await conns.close()
        return name

    assert run(main()) == options.get("application_name", application_name())
    assert application_name().endswith(f" {os.getpid()}")


def test_a_connection_is_reused_after_a_return_or_an_error_the_server_answered():
    import asyncio

    import psycopg

    from aaa_django.events import StoreUnavailable
    from aaa_django.store.connections import reusable_after

    assert reusable_after(None)
    assert reusable_after(psycopg.errors.UniqueViolation("refused"))  # a refusal: the round trip completed
    assert not reusable_after(asyncio.CancelledError())  # interrupted mid-call
    assert not reusable_after(psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_2" does not exist'))
    lost = StoreUnavailable("InvalidSqlStatementName: ...", transient=True)
    lost.__cause__ = psycopg.errors.InvalidSqlStatementName("gone")
    assert not reusable_after(lost)
    assert not reusable_after(psycopg.errors.DuplicatePreparedStatement("exists"))


def test_a_prepared_statement_out_of_step_is_a_transient_outage():
    import psycopg

    from aaa_django.events import StoreUnavailable
    from aaa_django.store.faults import translate

    for error in (psycopg.errors.InvalidSqlStatementName("gone"), psycopg.errors.DuplicatePreparedStatement("there")):
        assert translate(error, StoreUnavailable).transient  # nothing ran: the step is tried again
    assert translate(psycopg.errors.UndefinedTable("no table"), StoreUnavailable).transient is False


@on_postgres
def test_a_connection_whose_server_lost_its_prepared_statements_is_dropped(pg_alias):
    # Its server no longer holds what psycopg prepared there (DEALLOCATE ALL sent
    # past psycopg, by libpq): the next append fails as a transient outage, nothing
    # written, the connection is not used again, and the append after it succeeds on
    # a new one.
    from aaa_django.events import StoreUnavailable

    conns = PgConnections(pg_alias)
    store = PgEventStore(pg_alias)
    store.pg = conns
    stream = "run-prep-lost"

    async def main():
        await store.append([Event.new(stream, RUN_STARTED, {"algorithm": "tests.Algo", "input": {}})])
        for _ in range(PREPARE_THRESHOLD + 2):
            await store.append([ev(stream)])
        async with conns.connection() as conn:
            conn.pgconn.exec_(b"DEALLOCATE ALL")
        with pytest.raises(StoreUnavailable) as lost:
            await store.append([ev(stream, "x.lost")])
        assert lost.value.transient
        assert conns.opened == 1 and conns._idle == []  # dropped
        stored = await store.append([ev(stream, "x.after")])
        assert conns.opened == 2
        events = await store.read(stream)
        await conns.close()
        return lost.value, stored, events

    _, stored, events = run(main())
    assert [e.type for e in stored] == ["x.after"]
    assert "x.lost" not in [e.type for e in events]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


@on_postgres
def test_a_connection_whose_call_was_cancelled_midway_is_dropped(pg_alias):
    import asyncio

    conns = PgConnections(pg_alias)

    async def main():
        started = asyncio.Event()

        async def slow():
            async with conns.connection() as conn:
                started.set()
                await conn.execute("SELECT pg_sleep(30)")

        task = asyncio.ensure_future(slow())
        await started.wait()
        async with conns.connection() as watcher:  # a second connection sees the first's statement running
            for _ in range(500):
                cur = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'"
                )
                if (await cur.fetchone())[0]:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the statement never ran")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        idle = len(conns._idle)  # the watcher's only
        async with conns.connection():
            pass
        opened = conns.opened
        await conns.close()
        return idle, opened

    assert run(main()) == (1, 2)  # the cancelled one dropped; the watcher's kept and reused
