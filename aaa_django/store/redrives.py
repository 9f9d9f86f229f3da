"""The sweeper's ledger of re-drives in the run index: ``aaa_run.redriven_at`` (when
the sweeper last re-drove a run, epoch seconds) and ``aaa_run.redrives`` (how many
times). The rule that reads them is :mod:`aaa_django.celery.redrives`."""

from __future__ import annotations

from django.db import connections

__all__ = ["claim_redrive", "redriven"]

#: run ids per query (SQLite's limit on a statement's parameters is 999 in old builds)
CHUNK = 500

_CLAIM = "UPDATE aaa_run SET redriven_at = %s, redrives = redrives + 1 WHERE run_id = %s AND "


def redriven(using: str, run_ids: list[str]) -> dict[str, float]:
    """Run id -> when the sweeper last re-drove it, for those of ``run_ids`` it has."""
    out: dict[str, float] = {}
    with connections[using].cursor() as cur:
        for i in range(0, len(run_ids), CHUNK):
            chunk = run_ids[i : i + CHUNK]
            cur.execute(
                "SELECT run_id, redriven_at FROM aaa_run WHERE redriven_at IS NOT NULL "
                f"AND run_id IN ({', '.join(['%s'] * len(chunk))})",
                chunk,
            )
            out.update(cur.fetchall())
    return out


def claim_redrive(using: str, run_id: str, previous: float | None, now: float) -> bool:
    """Record a re-drive of ``run_id`` at ``now`` unless another was recorded since
    ``previous`` (a conditional UPDATE on the time read: two sweeps at once re-drive a
    run once). True: re-drive it, also when the run has no index row (nothing is
    recorded then, and nothing holds the run back)."""
    with connections[using].cursor() as cur:
        if previous is None:
            cur.execute(_CLAIM + "redriven_at IS NULL", [now, run_id])
        else:
            cur.execute(_CLAIM + "redriven_at = %s", [now, run_id, previous])
        if cur.rowcount:
            return True
        # Someone else re-drove it since (theirs stands), or the run has no index row.
        cur.execute("SELECT 1 FROM aaa_run WHERE run_id = %s", [run_id])
        return cur.fetchone() is None
