"""Run leases in the run index: which process drives each unfinished run, until when.

A run's row (``aaa_run``) names its holder (``held_by``: a process, see
:mod:`aaa_django.site.holding`) and how long the claim that made it so lasts
(``held_until``, seconds since the epoch on the *database's* clock, so processes on
machines whose clocks disagree still agree on what has lapsed); the holder's own row
(``aaa_holder``, :class:`~aaa_django.models.HolderRecord`) says until when every lease
of its lives (``alive_until``). A lease has lapsed once both times have passed (or its
holder let it go: ``held_until`` 0), so the holder renews all its leases with one
write to its own row, however many runs it holds (:meth:`RunLeases.renew`: at 3,000
runs, a renewal that wrote each run's row took 126 ms of the database every 1.5 s and
held 3,000 row locks the appends then waited on). A process that stops renewing
(killed, cut off) loses its runs once its row's time passes, and another process takes
them with a conditional ``UPDATE`` (:meth:`RunLeases.adopt`): two processes that try
at once adopt each run once, for the row lock decides and the condition is checked
again on the row as the winner left it.

Every statement runs on a connection of its own (:class:`RunLeases`: one per holder
and database, on the one thread that made it), so a lease's renewal neither waits for
nor holds up the connections the store's appends use. On PostgreSQL it connects with
TCP keepalives and a ``tcp_user_timeout`` (unless the alias's ``OPTIONS`` set them):
a holder cut off from its database finds out within seconds, not at the kernel's
retransmission timeout.

The column ``adoptions`` counts the times a run was adopted and ``adopted_at`` says
when it last was (the admin shows them); neither is derived from the log.
"""

from __future__ import annotations

import datetime
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from django.db import connections

from aaa_django.events import StoreUnavailable
from aaa_django.runtime.meta import OPEN_STATUSES

from .faults import translate

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

#: run ids per statement (SQLite's limit on a statement's parameters is 999 in old builds)
CHUNK = 500
#: the database's clock, in seconds since the epoch, by vendor (others: the caller's)
_NOW = {
    "postgresql": "EXTRACT(EPOCH FROM clock_timestamp())::double precision",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}
#: libpq's connection parameters of a lease connection on PostgreSQL (the alias's
#: ``OPTIONS`` win): a dead peer found by keepalives after 2 + 3 x 1 s of silence, a
#: statement whose packets go unacknowledged for 3 s fails, a connect gives up after 3 s
PG_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 3000,
    "connect_timeout": 3,
}
_OPEN = "status IN ({})".format(", ".join(f"'{s}'" for s in OPEN_STATUSES))
#: a run's lease has lapsed: its claim has run out, and its holder's renewals too (or
#: the holder let it go, ``held_until`` 0)
_LAPSED = (
    "held_until < {now} AND (held_until <= 0 OR NOT EXISTS (SELECT 1 FROM aaa_holder h "
    "WHERE h.holder_id = aaa_run.held_by AND h.alive_until >= {now}))"
)
#: a holder row that has not been renewed for this many seconds is deleted (its runs'
#: leases lapsed long before: they are adopted by then, or ended)
HOLDER_KEPT = 86_400.0


class RunLeases:
    """The leases of the runs in database ``using``, on a connection of this object's
    own. Use it from one thread (its connection is made there, on first use); every
    method is a statement or two in autocommit."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self._conn: BaseDatabaseWrapper | None = None

    def __repr__(self) -> str:
        return f"RunLeases({self.using!r})"

    # -- the connection ----------------------------------------------------------------------

    def connection(self) -> BaseDatabaseWrapper:
        """This object's Django connection to the alias (made on first use, on the
        calling thread), with keepalives and timeouts on PostgreSQL."""
        if self._conn is None:
            conn = connections.create_connection(self.using)
            if conn.vendor == "postgresql":
                options = {**PG_OPTIONS, **(conn.settings_dict.get("OPTIONS") or {})}
                conn.settings_dict = {**conn.settings_dict, "OPTIONS": options}
            self._conn = conn
        return self._conn

    def close(self) -> None:
        """Close the connection (on the thread that used it)."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _now(self) -> str:
        """The SQL of the database's clock (a vendor without one: this process's time,
        as a number in the statement)."""
        return _NOW.get(self.connection().vendor) or repr(float(time.time()))

    def _run(self, sql: str, params: Sequence[object], *, returns: bool = True) -> list[tuple]:
        """Run ``sql`` (``{now}`` stands for the database's clock). A driver's error
        leaves as :class:`~aaa_django.events.StoreUnavailable`."""
        conn = self.connection()
        text = sql.replace("{now}", self._now())
        try:
            with conn.cursor() as cur:
                cur.execute(text, list(params))
                return list(cur.fetchall()) if returns else []
        except Exception as exc:
            # (a broken connection is closed: the next call connects anew)
            if conn.connection is not None and not conn.is_usable():
                conn.close()
            fault = translate(exc, StoreUnavailable)
            if fault is not None:
                raise fault from exc
            raise
        finally:
            # With DEBUG on, Django logs each statement of a connection (its last 9,000):
            # this one is the object's own, which ``reset_queries`` never reaches (a
            # claim a run: 4.5 MB a worker). Emptied as ``reset_queries`` empties them.
            conn.queries_log.clear()

    def _returning(self) -> bool:
        """Whether the database answers ``UPDATE ... RETURNING`` (PostgreSQL; SQLite
        3.35 and later)."""
        vendor = self.connection().vendor
        return vendor == "postgresql" or (vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35))

    def _update(self, sets: str, where: str, params: Sequence[object], where_params: Sequence[object]) -> set[str]:
        """``UPDATE aaa_run SET {sets} WHERE {where}``; the run ids it changed. On
        PostgreSQL the rows are locked first, in run id order (the order the store's
        group commits lock their runs' rows in): a lease's statement and an append of
        several runs never wait on each other's rows in opposite orders."""
        vendor = self.connection().vendor
        if vendor == "postgresql":
            rows = self._run(
                f"WITH mine AS MATERIALIZED (SELECT run_id FROM aaa_run WHERE {where} "
                f'ORDER BY run_id COLLATE "C" FOR UPDATE) '
                f"UPDATE aaa_run SET {sets} FROM mine WHERE aaa_run.run_id = mine.run_id RETURNING aaa_run.run_id",
                [*where_params, *params],
            )
            return {r[0] for r in rows}
        if self._returning():
            rows = self._run(f"UPDATE aaa_run SET {sets} WHERE {where} RETURNING run_id", [*params, *where_params])
            return {r[0] for r in rows}
        # (an old SQLite: the rows, then the same condition again, in one transaction of
        # this connection; in WAL mode a write that another one preceded fails instead)
        conn = self.connection()
        conn.set_autocommit(False)
        try:
            found = {r[0] for r in self._run(f"SELECT run_id FROM aaa_run WHERE {where}", where_params)}
            self._run(f"UPDATE aaa_run SET {sets} WHERE {where}", [*params, *where_params], returns=False)
            conn.commit()
        except BaseException:
            if conn.connection is not None:
                conn.rollback()
            raise
        finally:
            if conn.connection is not None:
                conn.set_autocommit(True)
        return found

    # -- the holder's statements ---------------------------------------------------------------

    def renew(self, holder: str, ttl: float) -> set[str]:
        """Renew every lease ``holder`` has on an unfinished run for ``ttl`` seconds:
        one write, to the holder's own row (the runs' rows are not touched); then the
        runs it holds, read."""
        self._run(
            "INSERT INTO aaa_holder (holder_id, alive_until) VALUES (%s, {now} + %s) "
            "ON CONFLICT (holder_id) DO UPDATE SET alive_until = excluded.alive_until",
            [holder, ttl],
            returns=False,
        )
        rows = self._run(f"SELECT run_id FROM aaa_run WHERE held_by = %s AND {_OPEN}", [holder])
        return {r[0] for r in rows}

    def claim(self, holder: str, run_ids: Iterable[str], ttl: float, *, force: bool = False) -> set[str]:
        """Take the leases of the unfinished ``run_ids`` for ``holder``: those nobody
        holds, those it holds, those whose lease has lapsed; ``force``: whoever holds
        them (a process that is handed a run's work takes it). The runs it holds now."""
        ids = list(dict.fromkeys(run_ids))
        got: set[str] = set()
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i : i + CHUNK]
            where = f"run_id IN ({', '.join(['%s'] * len(chunk))}) AND {_OPEN}"
            where_params: list[object] = list(chunk)
            if not force:
                where += f" AND (held_by IS NULL OR held_by = %s OR ({_LAPSED}))"
                where_params.append(holder)
            got |= self._update("held_by = %s, held_until = {now} + %s", where, [holder, ttl], where_params)
        return got

    def release(self, holder: str, run_ids: Iterable[str] | None = None) -> set[str]:
        """Let ``holder``'s leases (of ``run_ids``; None: all of them) lapse now: the
        next process that looks adopts the runs (a worker that shuts down with runs in
        hand). The runs released."""
        where, params = f"held_by = %s AND {_OPEN}", [holder]
        if run_ids is None:
            # (and its row goes: the leases of runs claimed from now on live by their claims)
            self._run(
                "DELETE FROM aaa_holder WHERE holder_id = %s OR alive_until < {now} - %s",
                [holder, HOLDER_KEPT],
                returns=False,
            )
            return self._update("held_until = 0", where, [], params)
        ids, out = list(run_ids), set()
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i : i + CHUNK]
            out |= self._update(
                "held_until = 0", where + f" AND run_id IN ({', '.join(['%s'] * len(chunk))})", [], [*params, *chunk]
            )
        return out

    # -- adopting ------------------------------------------------------------------------------

    def lapsed(self, limit: int = 1000, *, fleet: str = "") -> list[tuple[str, str]]:
        """``(run id, holder)`` of the unfinished runs whose lease has lapsed, longest
        lapsed first, of holders of ``fleet`` (a holder id whose first part is
        ``<kind>@<fleet>``; ``""``: the holders with no fleet)."""
        match, pattern = ("LIKE", f"%@{fleet}|%") if fleet else ("NOT LIKE", "%@%")
        return [
            (r, h)
            for r, h in self._run(
                f"SELECT run_id, held_by FROM aaa_run WHERE {_OPEN} AND held_by IS NOT NULL "
                f"AND held_by {match} %s AND {_LAPSED} ORDER BY held_until LIMIT %s",
                [pattern, limit],
            )
        ]

    def holders(self) -> list[str]:
        """The holders of unfinished runs' leases, lapsed or not."""
        return [
            h for (h,) in self._run(f"SELECT DISTINCT held_by FROM aaa_run WHERE {_OPEN} AND held_by IS NOT NULL", [])
        ]

    def unheld(self, idle_since: datetime.datetime, limit: int = 1000) -> list[str]:
        """The unfinished runs no process holds whose newest indexed event is older than
        ``idle_since`` (a run started by an engine without a keeper, or before leases
        were kept), oldest first."""
        conn = self.connection()
        return [
            r
            for (r,) in self._run(
                f"SELECT run_id FROM aaa_run WHERE {_OPEN} AND held_by IS NULL AND updated_at < %s "
                "ORDER BY updated_at LIMIT %s",
                [conn.ops.adapt_datetimefield_value(idle_since), limit],
            )
        ]

    def adopt(
        self, holder: str, previous: str | None, run_ids: Sequence[str] | None, ttl: float, *, lapsed: bool = True
    ) -> set[str]:
        """Take for ``holder`` the unfinished runs ``previous`` holds (None: that nobody
        holds) of ``run_ids`` (None: all of them), only where their lease has lapsed
        unless ``lapsed`` is False (``previous`` is a process known to be dead, or
        nobody). Counted as an adoption in each row. The runs taken: each by one
        adopter, however many try at once."""
        sets = "held_by = %s, held_until = {now} + %s, adopted_at = {now}, adoptions = adoptions + 1"
        if previous is None:
            where, params, lapsed = f"held_by IS NULL AND {_OPEN}", [], False
        else:
            where, params = f"held_by = %s AND {_OPEN}", [previous]
        if lapsed:
            where += f" AND {_LAPSED}"
        if run_ids is None:
            return self._update(sets, where, [holder, ttl], params)
        ids, out = list(run_ids), set()
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i : i + CHUNK]
            out |= self._update(
                sets, where + f" AND run_id IN ({', '.join(['%s'] * len(chunk))})", [holder, ttl], [*params, *chunk]
            )
        return out

    def held(self, run_ids: Iterable[str]) -> dict[str, tuple[str | None, float | None]]:
        """Run id -> ``(holder, lease's end)`` of those of ``run_ids`` that have a row:
        the later of its claim's end and its holder's (the claim's, 0, once let go)."""
        ids, out = list(run_ids), {}
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i : i + CHUNK]
            rows = self._run(
                "SELECT r.run_id, r.held_by, r.held_until, h.alive_until FROM aaa_run r "
                "LEFT JOIN aaa_holder h ON h.holder_id = r.held_by "
                f"WHERE r.run_id IN ({', '.join(['%s'] * len(chunk))})",
                chunk,
            )
            out.update({r: (h, _end(u, alive)) for r, h, u, alive in rows})
        return out


def _end(claimed: float | None, alive: float | None) -> float | None:
    """A lease's end: its claim's, or its holder's if later (a lease let go: its claim's)."""
    if claimed is None or claimed <= 0 or alive is None:
        return claimed
    return max(claimed, alive)
