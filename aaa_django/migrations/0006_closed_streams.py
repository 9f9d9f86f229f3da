"""Nothing follows a run's completion, and a run's stream starts with its start.

Refused by the database, for every writer (PostgreSQL: 0002's dense-seq trigger, which
reads the stream's last event before every insert, reads its type too; SQLite: two
triggers of their own):

- an event after ``aaa.run.completed`` (a late result of a run that has ended);
- a first event of the runtime's ``aaa.`` types that is not ``aaa.run.started`` (a
  result written to a run that was erased, or never started: an orphan stream).

The messages start with ``aaa_event stream closed``: the store turns them into
:class:`~aaa_django.events.ClosedStreamError` (``aaa_django.store.rows.CLOSED``).
"""

from django.db import migrations

from aaa_django.migration_ops import VendorRunSQL

PG_CLOSED = r"""
CREATE OR REPLACE FUNCTION aaa_event_dense_seq() RETURNS trigger AS $$
DECLARE
    head_seq bigint;
    head_type varchar;
BEGIN
    SELECT seq, type INTO head_seq, head_type
        FROM aaa_event WHERE stream = NEW.stream ORDER BY seq DESC LIMIT 1;
    IF NEW.seq <> COALESCE(head_seq, 0) + 1 THEN
        RAISE EXCEPTION 'aaa_event seq % is not the next seq of stream %', NEW.seq, NEW.stream
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF head_type = 'aaa.run.completed' THEN
        RAISE EXCEPTION 'aaa_event stream closed: nothing is appended after aaa.run.completed (stream %)',
            NEW.stream USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF head_seq IS NULL AND left(NEW.type, 4) = 'aaa.' AND NEW.type <> 'aaa.run.started' THEN
        RAISE EXCEPTION 'aaa_event stream closed: a run''s stream starts with aaa.run.started, not % (stream %)',
            NEW.type, NEW.stream USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
"""

PG_DENSE = r"""
CREATE OR REPLACE FUNCTION aaa_event_dense_seq() RETURNS trigger AS $$
BEGIN
    IF NEW.seq <> COALESCE(
        (SELECT seq FROM aaa_event WHERE stream = NEW.stream ORDER BY seq DESC LIMIT 1), 0
    ) + 1 THEN
        RAISE EXCEPTION 'aaa_event seq % is not the next seq of stream %', NEW.seq, NEW.stream
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
"""

# SQLite: two triggers beside 0002's dense-seq one (which makes ``seq`` the stream's
# next): the event before the new one is found by its (stream, seq) key, a point
# lookup (~0.6 us an event in memory; reading the head's type in 0002's trigger
# instead cost ~4 us).
SQLITE_CLOSED = [
    """
    CREATE TRIGGER aaa_event_closed BEFORE INSERT ON aaa_event
    WHEN (SELECT type FROM aaa_event WHERE stream = NEW.stream AND seq = NEW.seq - 1)
        = 'aaa.run.completed'
    BEGIN
        SELECT RAISE(ABORT, 'aaa_event stream closed: nothing is appended after aaa.run.completed');
    END
    """,
    """
    CREATE TRIGGER aaa_event_run_start BEFORE INSERT ON aaa_event
    WHEN NEW.seq = 1 AND substr(NEW.type, 1, 4) = 'aaa.' AND NEW.type <> 'aaa.run.started'
    BEGIN
        SELECT RAISE(ABORT, 'aaa_event stream closed: a run''s stream starts with aaa.run.started');
    END
    """,
]

SQLITE_OPEN = ["DROP TRIGGER IF EXISTS aaa_event_run_start", "DROP TRIGGER IF EXISTS aaa_event_closed"]


class Migration(migrations.Migration):
    dependencies = [("aaa", "0005_sqlite_replace_triggers")]
    operations = [
        VendorRunSQL("postgresql", [PG_CLOSED], [PG_DENSE]),
        VendorRunSQL("sqlite", SQLITE_CLOSED, SQLITE_OPEN),
    ]
