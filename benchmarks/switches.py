"""What the library does without one of the private internals of its dependencies, for
an A/B of a user-visible benchmark: ``bench_concurrency.py --without NAME`` runs each
row as shipped and, in the same repetition, with ``AAA_BENCH_WITHOUT=NAME`` in its
processes' environment, where :func:`apply` puts the public API in the internal's place
(in the benchmark's processes only: the rows' child processes, the Celery workers'
site ``celery_site.py``, and the driver that starts the Celery row's runs).

Each switch names one use of a private internal and what replaces it:

- ``store-cursor``: the store's plain statements on PostgreSQL go through a copy of
  Django's cursor wrapper (``make_cursor``, ``validate_no_broken_transaction``);
  without it, through ``connection.cursor()``;
- ``fast-publish``: the Celery bus builds its messages with ``app.amqp.as_task_v2``
  and publishes them on a producer of its own; without it, ``app.send_task`` with a
  producer acquired from the app's pool for each batch of messages;
- ``client-reuse``: that publisher swaps kombu's Redis ``channel.Client`` for one
  client per connection pool; without it, kombu's client per message.

A name that the library has no use for is refused (:data:`SWITCHES`).
"""

from __future__ import annotations

import os
from typing import Callable

#: the environment variable that names the switches of a process (comma-separated)
ENV = "AAA_BENCH_WITHOUT"


def _store_cursor() -> None:
    from aaa_django.store import appends, database, rows

    def djangos(conn):
        return conn.cursor()

    for module in (rows, database, appends):
        module.cursor = djangos


def _fast_publish() -> None:
    from aaa_django.celery.bus import DistributedBus

    DistributedBus.publisher = lambda self: None


def _client_reuse() -> None:
    from aaa_django.celery import publish

    publish._reuse_redis_client = lambda channel: None


SWITCHES: dict[str, Callable[[], None]] = {
    "store-cursor": _store_cursor,
    "fast-publish": _fast_publish,
    "client-reuse": _client_reuse,
}


def names() -> list[str]:
    """The switches this process was started with (:data:`ENV`)."""
    return [n for n in os.environ.get(ENV, "").split(",") if n]


def apply() -> list[str]:
    """Apply this process's switches (once Django is set up); returns their names.
    Each process that applies any says so in ``$AAA_BENCH_TMP/switches.applied`` (its
    pid and the names: :func:`applied`)."""
    found = names()
    unknown = set(found) - set(SWITCHES)
    if unknown:
        raise SystemExit(f"{ENV}: unknown switches {sorted(unknown)}; known: {sorted(SWITCHES)}")
    for name in found:
        SWITCHES[name]()
    if found and os.environ.get("AAA_BENCH_TMP"):
        with open(os.path.join(os.environ["AAA_BENCH_TMP"], "switches.applied"), "a") as f:
            f.write(f"{os.getpid()} {','.join(found)}\n")
    return found


def applied() -> dict[int, str]:
    """pid -> the switches that process applied (this row's processes, see :func:`apply`)."""
    path = os.path.join(os.environ.get("AAA_BENCH_TMP", ""), "switches.applied")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {int(pid): found for pid, found in (line.split() for line in f if line.strip())}
