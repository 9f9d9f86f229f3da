"""What the library does without one of its shortcuts past a dependency's usual path,
for an A/B of a user-visible benchmark: ``bench_concurrency.py --without NAME`` runs each
row as shipped and, in the same repetition, with ``AAA_BENCH_WITHOUT=NAME`` in its
processes' environment, where :func:`apply` puts the usual path in the shortcut's place
(in the benchmark's processes only: the rows' child processes, the Celery workers'
site ``celery_site.py``, and the driver that starts the Celery row's runs).

Each switch names one shortcut and what replaces it:

- ``fast-publish``: the Celery bus builds its messages with
  ``app.amqp.create_task_message`` and publishes them on a producer of its own;
  without it, ``app.send_task`` with a producer acquired from the app's pool for each
  batch of messages.

A name that the library has no use for is refused (:data:`SWITCHES`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

#: the environment variable that names the switches of a process (comma-separated)
ENV = "AAA_BENCH_WITHOUT"


def _fast_publish() -> None:
    from aaa_django.celery.bus import DistributedBus

    DistributedBus.publisher = lambda self: None


SWITCHES: dict[str, Callable[[], None]] = {
    "fast-publish": _fast_publish,
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
