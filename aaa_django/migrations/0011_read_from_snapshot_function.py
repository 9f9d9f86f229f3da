"""A projection's snapshot and the events after it, as one function call (PostgreSQL only).

``aaa_read_from_snapshot(stream, name, version)`` returns the rows of the store's
snapshot read (``aaa_django.store.database._READ_FROM_SNAPSHOT`` on PostgreSQL): the
snapshot's seq, event id and state (the state in the first row only), then the
stream's events from the snapshot's seq on, one row of NULL events when there are
none, no row without a snapshot. The store calls it on a connection that does not
prepare its statements (Django's own, whose psycopg ``prepare_threshold`` Django
turns off for connection poolers; a store connection behind a pooler): PL/pgSQL keeps
the plan of its query for the session, where the same query sent as a statement is
parsed and planned at every read (its lateral join: 0.32 ms a read against 0.20 ms
prepared and 0.23 ms as this call, a 1,000-event stream read 50 events behind its
snapshot; ``benchmarks/bench_eventlog.py --only snapshot``). Nothing named is prepared on the
client, so a pooler that hands the next transaction to another server connection is
unaffected; a connection that prepares sends the statement (prepared, it is a little
cheaper than the call), as migration 0009's append does.

The output columns are named ``o_*`` so that none of them shadows a column of the
query; the store reads them by position.
"""

from django.db import migrations

from aaa_django.migration_ops import VendorRunSQL

PG_READ_FROM_SNAPSHOT = r"""
CREATE FUNCTION aaa_read_from_snapshot(p_stream varchar, p_name varchar, p_version integer)
RETURNS TABLE (
    o_snapshot_seq bigint, o_snapshot_event_id varchar, o_state text,
    o_id varchar, o_stream varchar, o_seq bigint, o_type varchar, o_data text,
    o_causation varchar, o_time text, o_blobs jsonb, o_tenant varchar
) AS $$
BEGIN
    RETURN QUERY
    SELECT s.seq, s.event_id, CASE WHEN e.seq IS NULL OR e.seq = s.seq THEN s.state END,
           e.id, e.stream, e.seq, e.type, e.data, e.causation,
           to_char(e.time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), e.blobs, e.tenant
    FROM aaa_snapshot AS s
    LEFT JOIN LATERAL (SELECT * FROM aaa_event WHERE stream = s.stream AND seq >= s.seq
                       OFFSET 0) AS e ON true
    WHERE s.stream = p_stream AND s.name = p_name AND s.version = p_version
    ORDER BY e.seq;
END $$ LANGUAGE plpgsql STABLE;
"""

PG_DROP = "DROP FUNCTION IF EXISTS aaa_read_from_snapshot(varchar, varchar, integer)"


class Migration(migrations.Migration):
    dependencies = [("aaa", "0010_drop_unread_like_indexes")]
    operations = [VendorRunSQL("postgresql", [PG_READ_FROM_SNAPSHOT], [PG_DROP])]
