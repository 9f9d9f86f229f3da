"""The run index's change position, ``aaa_run.changed``: the order of the runs' changes.

A row's ``changed`` moves whenever the row is made (a run started) or one of what a
watcher of runs sees changes: status, outcome, spend, end. The database writes it, in
the transaction of the change, whichever statement made it (the stores' appends, the
PL/pgSQL append of 0009, the ORM's catch-up and ``aaa_reindex``):

- PostgreSQL: the writing transaction's id (``pg_current_xact_id()``, 64-bit, never
  reused). Transactions commit in another order than their ids, so a reader takes only
  the rows below its snapshot's ``xmin`` (every transaction below it has ended): no row
  can later appear below what it has read (``aaa_django.store.changes``).
- SQLite: a counter (table ``aaa_run_change_counter``) moved by every change. Writes are
  serial there, so the counter's order is the commit order.

Rows made before this migration keep position 0.
"""

from django.conf import settings
from django.db import migrations, models

from aaa_django.migration_ops import VendorRunSQL

#: what a change of the row is: the columns a watcher of runs sees move
WATCHED = ("status", "outcome", "tokens_in", "tokens_out", "cost", "model_calls", "tool_calls",
           "ended_at")

PG_WHEN = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in WATCHED)
PG = [
    r"""
CREATE FUNCTION aaa_run_changed() RETURNS trigger AS $$
BEGIN
    NEW.changed := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
""",
    "CREATE TRIGGER aaa_run_changed_insert BEFORE INSERT ON aaa_run "
    "FOR EACH ROW EXECUTE FUNCTION aaa_run_changed();",
    f"CREATE TRIGGER aaa_run_changed_update BEFORE UPDATE ON aaa_run "
    f"FOR EACH ROW WHEN ({PG_WHEN}) EXECUTE FUNCTION aaa_run_changed();",
]
PG_REVERSE = [
    "DROP TRIGGER IF EXISTS aaa_run_changed_update ON aaa_run;",
    "DROP TRIGGER IF EXISTS aaa_run_changed_insert ON aaa_run;",
    "DROP FUNCTION IF EXISTS aaa_run_changed();",
]

_SQLITE_MOVE = """
    UPDATE aaa_run_change_counter SET n = n + 1;
    UPDATE aaa_run SET changed = (SELECT n FROM aaa_run_change_counter) WHERE run_id = NEW.run_id;
"""
SQLITE_WHEN = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in WATCHED)
SQLITE = [
    "CREATE TABLE aaa_run_change_counter (n integer NOT NULL);",
    "INSERT INTO aaa_run_change_counter (n) VALUES (0);",
    f"CREATE TRIGGER aaa_run_changed_insert AFTER INSERT ON aaa_run BEGIN {_SQLITE_MOVE} END;",
    f"CREATE TRIGGER aaa_run_changed_update AFTER UPDATE OF {', '.join(WATCHED)} ON aaa_run "
    f"WHEN {SQLITE_WHEN} BEGIN {_SQLITE_MOVE} END;",
]
#: the triggers again, after a migration that makes ``aaa_run`` again on SQLite (0013)
SQLITE_TRIGGERS_DROPPED = [
    "DROP TRIGGER IF EXISTS aaa_run_changed_update;",
    "DROP TRIGGER IF EXISTS aaa_run_changed_insert;",
]
SQLITE_TRIGGERS_AGAIN = [*SQLITE_TRIGGERS_DROPPED, *SQLITE[2:]]
SQLITE_REVERSE = [
    *SQLITE_TRIGGERS_DROPPED,
    "DROP TABLE IF EXISTS aaa_run_change_counter;",
]


class Migration(migrations.Migration):

    dependencies = [
        ('aaa', '0011_read_from_snapshot_function'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='runrecord',
            name='changed',
            field=models.BigIntegerField(db_default=0, default=0, editable=False, verbose_name='change position'),
        ),
        migrations.AddIndex(
            model_name='runrecord',
            index=models.Index(fields=['changed', 'run_id'], name='aaa_run_changed'),
        ),
        VendorRunSQL("postgresql", PG, PG_REVERSE),
        VendorRunSQL("sqlite", SQLITE, SQLITE_REVERSE),
    ]
