"""SQLite: the log's invariants hold against ``INSERT OR REPLACE`` / ``REPLACE INTO``.

A REPLACE deletes the row it conflicts with and inserts the new one without firing
DELETE or UPDATE triggers (``recursive_triggers`` is off), so 0002's UPDATE triggers
never see it: an event could move to another seq with new data, a snapshot's seq go
backwards. BEFORE INSERT triggers look for the row a REPLACE would delete:

- an event whose id is stored already (an insert at a taken (stream, seq) is refused
  by 0002's dense-seq trigger);
- a snapshot of the same (stream, name, version) at a later seq.

PostgreSQL has no REPLACE (its ``ON CONFLICT DO UPDATE`` fires 0002's UPDATE trigger).
"""

from django.db import migrations

from aaa_django.migration_ops import VendorRunSQL


class Migration(migrations.Migration):
    dependencies = [("aaa", "0004_runrecord_forks_retention")]
    operations = [
        VendorRunSQL(
            "sqlite",
            """
            CREATE TRIGGER aaa_event_no_replace BEFORE INSERT ON aaa_event
            WHEN EXISTS (SELECT 1 FROM aaa_event WHERE id = NEW.id)
            BEGIN
                SELECT RAISE(ABORT, 'aaa_event is append-only: an event id is stored once');
            END
            """,
            "DROP TRIGGER IF EXISTS aaa_event_no_replace",
        ),
        VendorRunSQL(
            "sqlite",
            """
            CREATE TRIGGER aaa_snapshot_no_replace_back BEFORE INSERT ON aaa_snapshot
            WHEN EXISTS (
                SELECT 1 FROM aaa_snapshot WHERE stream = NEW.stream AND name = NEW.name
                    AND version = NEW.version AND seq > NEW.seq
            )
            BEGIN
                SELECT RAISE(ABORT, 'aaa_snapshot seq never goes backwards');
            END
            """,
            "DROP TRIGGER IF EXISTS aaa_snapshot_no_replace_back",
        ),
    ]
