"""Database triggers that keep the log's invariants for every writer, raw SQL included.

- aaa_event is append-only: no UPDATE (DELETE stays possible: erasure).
- seq is dense per stream: an insert must take the stream's next seq.
- a snapshot's seq never goes backwards.
PostgreSQL and SQLite get the same rules in their own dialects.
"""

from django.db import migrations

POSTGRES = [
    (
        """
        CREATE FUNCTION aaa_event_append_only() RETURNS trigger AS $$
        BEGIN
            RAISE EXCEPTION 'aaa_event is append-only: events are never updated in place'
                USING ERRCODE = 'integrity_constraint_violation';
        END $$ LANGUAGE plpgsql;
        CREATE TRIGGER aaa_event_no_update BEFORE UPDATE ON aaa_event
            FOR EACH ROW EXECUTE FUNCTION aaa_event_append_only();

        CREATE FUNCTION aaa_event_dense_seq() RETURNS trigger AS $$
        BEGIN
            IF NEW.seq <> COALESCE(
                (SELECT seq FROM aaa_event WHERE stream = NEW.stream ORDER BY seq DESC LIMIT 1), 0
            ) + 1 THEN
                RAISE EXCEPTION 'aaa_event seq % is not the next seq of stream %', NEW.seq, NEW.stream
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql;
        CREATE TRIGGER aaa_event_dense_seq BEFORE INSERT ON aaa_event
            FOR EACH ROW EXECUTE FUNCTION aaa_event_dense_seq();

        CREATE FUNCTION aaa_snapshot_monotonic() RETURNS trigger AS $$
        BEGIN
            IF NEW.seq < OLD.seq THEN
                RAISE EXCEPTION 'aaa_snapshot seq never goes backwards (% < %)', NEW.seq, OLD.seq
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql;
        CREATE TRIGGER aaa_snapshot_monotonic BEFORE UPDATE ON aaa_snapshot
            FOR EACH ROW EXECUTE FUNCTION aaa_snapshot_monotonic();
        """,
        """
        DROP TRIGGER IF EXISTS aaa_snapshot_monotonic ON aaa_snapshot;
        DROP FUNCTION IF EXISTS aaa_snapshot_monotonic();
        DROP TRIGGER IF EXISTS aaa_event_dense_seq ON aaa_event;
        DROP FUNCTION IF EXISTS aaa_event_dense_seq();
        DROP TRIGGER IF EXISTS aaa_event_no_update ON aaa_event;
        DROP FUNCTION IF EXISTS aaa_event_append_only();
        """,
    )
]

SQLITE = [
    (
        """
        CREATE TRIGGER aaa_event_no_update BEFORE UPDATE ON aaa_event
        BEGIN
            SELECT RAISE(ABORT, 'aaa_event is append-only: events are never updated in place');
        END
        """,
        "DROP TRIGGER IF EXISTS aaa_event_no_update",
    ),
    (
        """
        CREATE TRIGGER aaa_event_dense_seq BEFORE INSERT ON aaa_event
        WHEN NEW.seq <> COALESCE(
            (SELECT seq FROM aaa_event WHERE stream = NEW.stream ORDER BY seq DESC LIMIT 1), 0
        ) + 1
        BEGIN
            SELECT RAISE(ABORT, 'aaa_event seq is not the next seq of its stream');
        END
        """,
        "DROP TRIGGER IF EXISTS aaa_event_dense_seq",
    ),
    (
        """
        CREATE TRIGGER aaa_snapshot_monotonic BEFORE UPDATE ON aaa_snapshot
        WHEN NEW.seq < OLD.seq
        BEGIN
            SELECT RAISE(ABORT, 'aaa_snapshot seq never goes backwards');
        END
        """,
        "DROP TRIGGER IF EXISTS aaa_snapshot_monotonic",
    ),
]


def _run(apps, schema_editor, forward: bool) -> None:
    vendor = schema_editor.connection.vendor
    statements = {"postgresql": POSTGRES, "sqlite": SQLITE}.get(vendor)
    if statements is None:
        # Other databases keep the unique constraints; the store enforces the rest.
        return
    for create, drop in statements if forward else reversed(statements):
        # params=None: the PL/pgSQL bodies use % placeholders of their own.
        schema_editor.execute(create if forward else drop, params=None)


def forwards(apps, schema_editor):
    _run(apps, schema_editor, True)


def backwards(apps, schema_editor):
    _run(apps, schema_editor, False)


class Migration(migrations.Migration):
    dependencies = [("aaa", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
