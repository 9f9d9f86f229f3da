"""Database triggers that keep the log's invariants for every writer, raw SQL included.

- aaa_event is append-only: no UPDATE (DELETE stays possible: erasure).
- seq is dense per stream: an insert must take the stream's next seq.
- a snapshot's seq never goes backwards.
PostgreSQL and SQLite get the same rules in their own dialects, one ``RunSQL`` per
vendor, so ``manage.py sqlmigrate aaa 0002`` prints what a database runs. Other
databases keep the unique constraints; the store enforces the rest.

(Until 0.1 this migration was a RunPython that ran the same statements: databases
migrated then have the same triggers and do not run it again.)
"""

from django.db import migrations

from aaa_django.migration_ops import VendorRunSQL

# Each statement alone (params None: the PL/pgSQL bodies have % placeholders of their own).
POSTGRES = [
    """
        CREATE FUNCTION aaa_event_append_only() RETURNS trigger AS $$
        BEGIN
            RAISE EXCEPTION 'aaa_event is append-only: events are never updated in place'
                USING ERRCODE = 'integrity_constraint_violation';
        END $$ LANGUAGE plpgsql""",
    """
        CREATE TRIGGER aaa_event_no_update BEFORE UPDATE ON aaa_event
            FOR EACH ROW EXECUTE FUNCTION aaa_event_append_only()""",
    """
        CREATE FUNCTION aaa_event_dense_seq() RETURNS trigger AS $$
        BEGIN
            IF NEW.seq <> COALESCE(
                (SELECT seq FROM aaa_event WHERE stream = NEW.stream ORDER BY seq DESC LIMIT 1), 0
            ) + 1 THEN
                RAISE EXCEPTION 'aaa_event seq % is not the next seq of stream %', NEW.seq, NEW.stream
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql""",
    """
        CREATE TRIGGER aaa_event_dense_seq BEFORE INSERT ON aaa_event
            FOR EACH ROW EXECUTE FUNCTION aaa_event_dense_seq()""",
    """
        CREATE FUNCTION aaa_snapshot_monotonic() RETURNS trigger AS $$
        BEGIN
            IF NEW.seq < OLD.seq THEN
                RAISE EXCEPTION 'aaa_snapshot seq never goes backwards (% < %)', NEW.seq, OLD.seq
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql""",
    """
        CREATE TRIGGER aaa_snapshot_monotonic BEFORE UPDATE ON aaa_snapshot
            FOR EACH ROW EXECUTE FUNCTION aaa_snapshot_monotonic()""",
]

POSTGRES_DROP = [
    "DROP TRIGGER IF EXISTS aaa_snapshot_monotonic ON aaa_snapshot",
    "DROP FUNCTION IF EXISTS aaa_snapshot_monotonic()",
    "DROP TRIGGER IF EXISTS aaa_event_dense_seq ON aaa_event",
    "DROP FUNCTION IF EXISTS aaa_event_dense_seq()",
    "DROP TRIGGER IF EXISTS aaa_event_no_update ON aaa_event",
    "DROP FUNCTION IF EXISTS aaa_event_append_only()",
]

SQLITE = [
    """
        CREATE TRIGGER aaa_event_no_update BEFORE UPDATE ON aaa_event
        BEGIN
            SELECT RAISE(ABORT, 'aaa_event is append-only: events are never updated in place');
        END
        """,
    """
        CREATE TRIGGER aaa_event_dense_seq BEFORE INSERT ON aaa_event
        WHEN NEW.seq <> COALESCE(
            (SELECT seq FROM aaa_event WHERE stream = NEW.stream ORDER BY seq DESC LIMIT 1), 0
        ) + 1
        BEGIN
            SELECT RAISE(ABORT, 'aaa_event seq is not the next seq of its stream');
        END
        """,
    """
        CREATE TRIGGER aaa_snapshot_monotonic BEFORE UPDATE ON aaa_snapshot
        WHEN NEW.seq < OLD.seq
        BEGIN
            SELECT RAISE(ABORT, 'aaa_snapshot seq never goes backwards');
        END
        """,
]

SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS aaa_snapshot_monotonic",
    "DROP TRIGGER IF EXISTS aaa_event_dense_seq",
    "DROP TRIGGER IF EXISTS aaa_event_no_update",
]


class Migration(migrations.Migration):
    dependencies = [("aaa", "0001_initial")]
    operations = [
        VendorRunSQL("postgresql", POSTGRES, POSTGRES_DROP),
        VendorRunSQL("sqlite", SQLITE, SQLITE_DROP),
    ]
