"""A test database's flush that cannot deadlock with the workers still at work.

Django empties a PostgreSQL database after a ``transaction=True`` test with one
``TRUNCATE "a", "b", ...;``, which takes the tables' ACCESS EXCLUSIVE locks one by one,
holding those it has while it waits for the next. The tests' Celery workers go on
reading the database after a test has its result (their duty every half second, a step
that lost its race and reads again): a worker that has read table B and then reads
table A, which the TRUNCATE holds while it waits for B, closes a cycle, and PostgreSQL
ends the TRUNCATE: the test errors at its teardown (CI: ``deadlock detected`` flushing
``test_aaa_gw1`` after tests/celery/test_serialisation.py).

:class:`LockFirst` takes every lock of the statement at once, waiting for none
(``LOCK TABLE ... NOWAIT`` in a savepoint): while another transaction holds a table
the attempt fails at once, the savepoint gives back what it took, and it tries again;
holding them all, the TRUNCATE waits for nothing, so no cycle can form. A worker that
reads meanwhile waits for the flush to commit, as it would for any writer.
tests/conftest.py installs it (Django's public ``execute_wrapper``) on the PostgreSQL
connections around each test's teardown; tests/repo/test_flush.py shows the deadlock without
it and none with it.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

from django.db import OperationalError, transaction

#: Django's PostgreSQL flush statement (``DatabaseOperations.sql_flush``)
_TRUNCATE = re.compile(r"TRUNCATE (?P<tables>.+?)(?: RESTART IDENTITY)?(?: CASCADE)?;?", re.S)
#: PostgreSQL's lock_not_available (a NOWAIT lock another transaction holds)
_LOCK_NOT_AVAILABLE = "55P03"


class LockFirst:
    """An execute wrapper: a ``TRUNCATE`` goes only once ``LOCK TABLE`` of its tables,
    NOWAIT, succeeded; other statements pass as they are. ``attempts``: the lock
    attempts made (tests/repo/test_flush.py waits on it). ``deadline``: seconds to keep
    trying before the flush fails naming the sessions in its way."""

    def __init__(self, *, deadline: float = 120.0, pause: float = 0.01) -> None:
        self.deadline = deadline
        self.pause = pause
        self.attempts = 0

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        match = _TRUNCATE.fullmatch(sql.strip()) if params is None and not many else None
        if match is None:
            return execute(sql, params, many, context)
        connection, cursor = context["connection"], context["cursor"]
        lock = f"LOCK TABLE {match['tables']} IN ACCESS EXCLUSIVE MODE NOWAIT"
        end = time.monotonic() + self.deadline
        while True:
            self.attempts += 1
            try:
                # a savepoint: a failed attempt gives back the locks it took
                with transaction.atomic(using=connection.alias):
                    cursor.execute(lock)
                break
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                    raise
                if time.monotonic() > end:
                    raise RuntimeError(
                        f"flushing {connection.settings_dict['NAME']}: its tables stayed "
                        f"locked {self.deadline} s by {_others(cursor)}"
                    ) from exc
            time.sleep(self.pause)
        return execute(sql, params, many, context)


def _others(cursor: Any) -> list[tuple[Any, ...]]:
    cursor.execute(
        "SELECT pid, state, left(query, 200) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return list(cursor.fetchall())
