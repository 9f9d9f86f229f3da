"""An agent run's common append on PostgreSQL as one function call (PostgreSQL only).

``aaa_append_event`` inserts one event of a run's stream and folds it into the run's
index row, guarded by the row's ``last_seq``, and returns the number of rows it
updated (0: the row moved meanwhile, the caller catches it up; the event is stored
either way, as with the statement it replaces). The store calls it for a batch of
one event on a connection that does not prepare its statements (Django's own, whose
psycopg ``prepare_threshold`` Django turns off for connection poolers; a store
connection behind a pooler): PL/pgSQL keeps the plans of its two statements for the
session, so the server plans them once a connection, where the same work as one
unprepared ``WITH stored AS (INSERT ...) UPDATE`` statement is parsed and planned at
every append (0.08 ms of its 0.36 ms on the benchmark machine,
``benchmarks/ab_append_call.py``). Nothing is kept between calls on the client
and nothing named is prepared, so a pooler that hands the next transaction to
another server connection is unaffected. A connection that prepares sends the
statement instead (prepared, it is a little cheaper than the call).

``p_set``: which of the row's folded columns to write, one bit each in the order of
the parameters (``algorithm`` 1 ... ``tool_calls`` 256, ``ended_at`` 512); the others
keep what the row holds, as the statement's UPDATE names only the columns the fold
changed (``aaa_django.store.runindex.row_update``). ``updated_at``, ``last_seq`` and
``due_at`` are always written. The event's refusals (the unique ``(stream, seq)`` and
``id``, the triggers of 0002 and 0006) leave the call with their own SQLSTATE and
message, as they leave the statement.
"""

from django.db import migrations

from aaa_django.migration_ops import VendorRunSQL

PG_APPEND_EVENT = r"""
CREATE FUNCTION aaa_append_event(
    p_id varchar, p_stream varchar, p_seq bigint, p_type varchar, p_data text,
    p_causation varchar, p_time timestamptz, p_blobs jsonb, p_tenant varchar,
    p_last_seq bigint, p_set integer,
    p_algorithm varchar, p_status varchar, p_outcome varchar, p_parent varchar,
    p_tokens_in bigint, p_tokens_out bigint, p_cost double precision,
    p_model_calls integer, p_tool_calls integer,
    p_updated_at timestamptz, p_due_at double precision, p_ended_at timestamptz
) RETURNS integer AS $$
DECLARE
    updated integer;
BEGIN
    INSERT INTO aaa_event (id, stream, seq, type, data, causation, time, blobs, tenant)
        VALUES (p_id, p_stream, p_seq, p_type, p_data, p_causation, p_time, p_blobs, p_tenant);
    UPDATE aaa_run SET
        algorithm = CASE WHEN p_set & 1 <> 0 THEN p_algorithm ELSE algorithm END,
        status = CASE WHEN p_set & 2 <> 0 THEN p_status ELSE status END,
        outcome = CASE WHEN p_set & 4 <> 0 THEN p_outcome ELSE outcome END,
        parent = CASE WHEN p_set & 8 <> 0 THEN p_parent ELSE parent END,
        tokens_in = CASE WHEN p_set & 16 <> 0 THEN p_tokens_in ELSE tokens_in END,
        tokens_out = CASE WHEN p_set & 32 <> 0 THEN p_tokens_out ELSE tokens_out END,
        cost = CASE WHEN p_set & 64 <> 0 THEN p_cost ELSE cost END,
        model_calls = CASE WHEN p_set & 128 <> 0 THEN p_model_calls ELSE model_calls END,
        tool_calls = CASE WHEN p_set & 256 <> 0 THEN p_tool_calls ELSE tool_calls END,
        ended_at = CASE WHEN p_set & 512 <> 0 THEN p_ended_at ELSE ended_at END,
        updated_at = p_updated_at, last_seq = p_seq, due_at = p_due_at
        WHERE run_id = p_stream AND last_seq = p_last_seq;
    GET DIAGNOSTICS updated = ROW_COUNT;
    RETURN updated;
END $$ LANGUAGE plpgsql;
"""

PG_DROP = ("DROP FUNCTION IF EXISTS aaa_append_event(varchar, varchar, bigint, varchar, text, "
           "varchar, timestamptz, jsonb, varchar, bigint, integer, varchar, varchar, varchar, "
           "varchar, bigint, bigint, double precision, integer, integer, timestamptz, "
           "double precision, timestamptz)")


class Migration(migrations.Migration):
    dependencies = [("aaa", "0008_runrecord_redriven")]
    operations = [VendorRunSQL("postgresql", [PG_APPEND_EVENT], [PG_DROP])]
