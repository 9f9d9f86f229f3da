"""Drop two indexes nothing reads, which every append wrote (PostgreSQL only).

Django gives a ``CharField`` primary key on PostgreSQL a second index, with the
``varchar_pattern_ops`` operator class, for ``LIKE 'prefix%'`` queries (``startswith``).
Nothing of this app asks one of an event's id or a run's id: the log reads events by
``(stream, seq)`` and by id exactly (the primary key's own index), the admin searches
event ids exactly (``=id``) and run ids with ``icontains`` (``UPPER(...) LIKE``,
which no btree index serves). Yet the event's was written at every append, and
weighed as much as the primary key: without it an append of one event writes 10-13%
less WAL (``append_sync`` 968 bytes to 838, a run's event on ``PgEventStore`` 1,043 to
962), and the event table's indexes hold 124 bytes an event instead of 197
(``benchmarks/bench_eventlog.py --only appends`` prints the WAL an event). The run's was
written with each new run.

``CONCURRENTLY`` (so the migration is not atomic): a site with a large log does not
hold its tables locked while the index goes, nor while it comes back on the way back.
Django names these indexes from the table and column (the names below are the ones
it gave them); were a later migration to alter either column, Django would make the
index again, and ``tests/app/test_migrations.py`` fails while one is there.
"""

from django.db import migrations

from aaa_django.migration_ops import VendorRunSQL

#: (index, table, column): Django's ``_like`` indexes of the two primary keys
LIKE_INDEXES = (
    ("aaa_event_id_f659985e_like", "aaa_event", "id"),
    ("aaa_run_run_id_d08c1ef7_like", "aaa_run", "run_id"),
)

DROP = [f"DROP INDEX CONCURRENTLY IF EXISTS {name}" for name, _, _ in LIKE_INDEXES]
CREATE = [f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({column} varchar_pattern_ops)"
          for name, table, column in LIKE_INDEXES]


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY runs outside a transaction
    dependencies = [("aaa", "0009_append_event_function")]
    operations = [VendorRunSQL("postgresql", DROP, CREATE)]
