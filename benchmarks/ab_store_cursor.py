"""A/B: the Django store's append of one event to a run's stream on PostgreSQL, its
statement on the store's cursor (``rows.StoreCursor``: Django's error translation, no
wrapper chain) against the same statement through Django's cursor wrapper (what it is
sent through where the site logs queries or wraps them), on the same connection, in the
same run.

    .venv/bin/python benchmarks/ab_store_cursor.py [--blocks 30] [--block 200]

Blocks of ``--block`` appends (``append_sync``, one event each, every one from the
store's hint: the append function's call, one round trip), the two cursors alternated
and the order rotated and swapped every block, each on a run of its own; and raw
psycopg's transaction per event (BEGIN, INSERT, COMMIT: ``bench_eventlog.py``'s "raw
driver, sync") in the same rotation. Django's wrapper is chosen by monkeypatching
``aaa_django.store.appends.cursor`` for its blocks. Prints the medians per append, the
store cursor's time over the wrapper's (the median of the blocks' pairs) and each
against raw (rate over rate, as bench_eventlog's "vs raw").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_append_call import ab_appends
from common import postgres, setup_django, workdir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--block", type=int, default=200)
    args = ap.parse_args()
    with workdir() as tmp, postgres(tmp) as pg:
        setup_django(tmp, pg)
        from django.db.backends.postgresql.base import ServerBindingCursor

        def wrapped(conn):
            """``rows.cursor`` through Django's wrapper: the server-binding cursor in it."""
            conn.ensure_connection()
            conn.validate_thread_sharing()
            return conn.make_cursor(ServerBindingCursor(conn.connection))

        ab_appends(pg, {"store": {}, "django": {"cursor": wrapped}}, args.blocks, args.block)


if __name__ == "__main__":
    main()
