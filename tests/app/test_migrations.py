"""The app's migrations as a DBA reads and runs them: ``sqlmigrate`` shows the trigger
SQL of each vendor, and a fresh database migrates forwards, back and forwards again."""

from __future__ import annotations

import io
import re
import sqlite3

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.migrations import RunSQL as migrations_RunSQL

from ..project.test_site import manage

pytestmark = pytest.mark.django_db(databases="__all__")

TRIGGERS = {"aaa_event_no_update", "aaa_event_dense_seq", "aaa_snapshot_monotonic"}


def sqlmigrate(alias: str, *args: str) -> str:
    out = io.StringIO()
    call_command("sqlmigrate", "aaa", "0002", *args, database=alias, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(databases="__all__", transaction=True)  # SQLite's schema editor
def test_sqlmigrate_shows_the_trigger_sql_of_the_databases_vendor(db_alias):
    forwards, backwards = sqlmigrate(db_alias), sqlmigrate(db_alias, "--backwards")
    for name in TRIGGERS:
        assert f"CREATE TRIGGER {name} BEFORE" in forwards
        assert f"DROP TRIGGER IF EXISTS {name}" in backwards
    postgres = connections[db_alias].vendor == "postgresql"
    assert ("CREATE FUNCTION aaa_event_dense_seq() RETURNS trigger" in forwards) is postgres
    assert ("RAISE(ABORT" in forwards) is not postgres


def triggers(alias: str) -> set[str]:
    sql = (
        "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'aaa%%'"
        if connections[alias].vendor == "postgresql"
        else "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'aaa%%'"
    )
    with connections[alias].cursor() as cur:
        cur.execute(sql)
        return {name for (name,) in cur.fetchall()}


def made_by_migrations(vendor: str, upto: str | None = None) -> set[str]:
    """The triggers the app's migrations leave on a database of ``vendor``, applied in
    order up to ``upto`` (a migration's number; None: all): each ``CREATE TRIGGER`` of
    their forward SQL, less each ``DROP TRIGGER`` after it."""
    from django.db.migrations.loader import MigrationLoader

    from aaa_django.migration_ops import VendorRunSQL

    loader = MigrationLoader(None, ignore_no_migrations=True)
    names: set[str] = set()
    for app, name in loader.graph.forwards_plan(("aaa", loader.graph.leaf_nodes("aaa")[0][1])):
        if app != "aaa" or (upto is not None and name[:4] > upto):
            continue
        for op in loader.graph.nodes[(app, name)].operations:
            if not isinstance(op, migrations_RunSQL) or (isinstance(op, VendorRunSQL) and op.vendor != vendor):
                continue
            statements = [op.sql] if isinstance(op.sql, str) else list(op.sql)
            for sql in statements:
                for verb, trigger in re.findall(r"(CREATE|DROP) TRIGGER (?:IF EXISTS )?(\w+)", str(sql)):
                    (names.add if verb == "CREATE" else names.discard)(trigger)
    return names


def test_the_test_database_has_every_trigger_the_migrations_make(db_alias):
    """Whatever a later migration does to a table (SQLite makes a table again to add some
    columns, and its triggers go with the old one), each trigger is there at the end."""
    expected = made_by_migrations(connections[db_alias].vendor)
    assert TRIGGERS | {"aaa_run_changed_insert", "aaa_run_changed_update"} <= expected
    assert triggers(db_alias) == expected


@pytest.mark.parametrize(
    ("migration", "function", "returns"),
    [
        ("0009", "aaa_append_event", "integer"),  # a run's one-event append: the rows it updated
        ("0011", "aaa_read_from_snapshot", "TABLE(%"),  # a snapshot's read: its rows
    ],
)
def test_postgresql_has_the_functions_and_sqlite_none(db_alias, migration, function, returns):
    """Migrations 0009 and 0011: PostgreSQL's functions of the store's calls, which
    ``sqlmigrate`` shows made and dropped; nothing on SQLite."""
    from aaa_django.store.database import READ_FROM_SNAPSHOT_CALL
    from aaa_django.store.runindex import APPEND_EVENT

    conn = connections[db_alias]
    with conn.cursor() as cur:
        if conn.vendor != "postgresql":
            cur.execute("SELECT count(*) FROM sqlite_master WHERE sql LIKE %s", [f"%{function}%"])
            assert cur.fetchone() == (0,)
            return
        cur.execute(
            "SELECT pronargs, pg_get_function_result(oid) LIKE %s FROM pg_proc WHERE proname = %s", [returns, function]
        )
        call = APPEND_EVENT if function == "aaa_append_event" else READ_FROM_SNAPSHOT_CALL
        assert cur.fetchall() == [(call.count("%s"), True)]
    forwards, backwards = io.StringIO(), io.StringIO()
    call_command("sqlmigrate", "aaa", migration, database=db_alias, stdout=forwards)
    call_command("sqlmigrate", "aaa", migration, "--backwards", database=db_alias, stdout=backwards)
    assert f"CREATE FUNCTION {function}(" in forwards.getvalue()
    assert f"DROP FUNCTION IF EXISTS {function}(" in backwards.getvalue()


@pytest.mark.slow
def test_a_fresh_database_migrates_forwards_back_and_forwards_again(tmp_path):
    """Forwards, back to 0012 (the table made again without 0013's columns), back to the
    start, forwards: at each stop, the triggers the migrations up to there make."""
    db = {"AAA_SQLITE_PATH": str(tmp_path / "fresh.sqlite3")}
    for target in (None, "0012", "0001", None):
        result = manage("migrate", *(["aaa", target] if target else []), "--verbosity", "0", **db)
        assert result.returncode == 0, (target, result.stderr)
        con = sqlite3.connect(db["AAA_SQLITE_PATH"])
        found = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        con.close()
        assert found == made_by_migrations("sqlite", target), target


def like_indexes(alias: str) -> set[str]:
    """Indexes of the log's tables (events, runs) with a ``LIKE`` operator class."""
    with connections[alias].cursor() as cur:
        cur.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename IN ('aaa_event', 'aaa_run') "
            "AND indexdef LIKE '%%pattern_ops%%'"
        )
        return {name for (name,) in cur.fetchall()}


@pytest.mark.django_db(databases=["postgres"])
def test_the_log_tables_have_no_like_index_every_append_would_write(pg_alias):
    """Migration 0010: Django's ``varchar_pattern_ops`` twins of the event's and the run's
    primary keys are gone (nothing reads them, every append wrote one); the primary keys'
    own indexes stay."""
    assert like_indexes(pg_alias) == set()
    with connections[pg_alias].cursor() as cur:
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename IN ('aaa_event', 'aaa_run')")
        names = {name for (name,) in cur.fetchall()}
    assert {"aaa_event_pkey", "aaa_run_pkey", "aaa_event_stream_seq"} <= names


@pytest.mark.slow
@pytest.mark.django_db(databases=["postgres"])
def test_postgresql_migrates_forwards_back_and_forwards_again(pg_alias):
    """A fresh PostgreSQL database, by ``manage.py migrate`` as a site runs it: forwards,
    back to 0009 (0010's indexes made again, concurrently; 0011's function dropped), back
    to the start, forwards."""
    import uuid

    import psycopg

    settings = connections[pg_alias].settings_dict
    name = f"aaa_migrate_{uuid.uuid4().hex[:12]}"
    server = dict(host=settings["HOST"], port=settings["PORT"], user=settings["USER"], autocommit=True)
    env = {
        "AAA_DB": "postgres",
        "AAA_PG_HOST": settings["HOST"],
        "AAA_PG_PORT": str(settings["PORT"]),
        "AAA_PG_NAME": name,
        "AAA_PG_USER": settings["USER"],
    }

    def likes() -> set[str]:
        with psycopg.connect(**server, dbname=name) as conn:
            return {
                n
                for (n,) in conn.execute(
                    "SELECT indexname FROM pg_indexes WHERE tablename IN ('aaa_event', 'aaa_run') "
                    "AND indexdef LIKE '%pattern_ops%'"
                )
            }

    def functions() -> set[str]:
        with psycopg.connect(**server, dbname=name) as conn:
            return {n for (n,) in conn.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'aaa%'")}

    with psycopg.connect(**server, dbname="postgres") as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        for args, expected in (
            (["migrate"], set()),
            (["migrate", "aaa", "0009"], {"aaa_event_id_f659985e_like", "aaa_run_run_id_d08c1ef7_like"}),
            (["migrate", "aaa", "zero"], None),
            (["migrate"], set()),
        ):
            result = manage(*args, "--verbosity", "0", **env)
            assert result.returncode == 0, (args, result.stderr)
            if expected is not None:
                assert likes() == expected, args
                # 0009's append function from 0009 on, 0011's snapshot read after 0010
                assert functions() >= {"aaa_append_event"}, args
                assert ("aaa_read_from_snapshot" in functions()) is (args == ["migrate"]), args
        with psycopg.connect(**server, dbname=name) as conn:
            found = {n for (n,) in conn.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'aaa%'")}
        assert found == made_by_migrations("postgresql")
    finally:
        with psycopg.connect(**server, dbname="postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
