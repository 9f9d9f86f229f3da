"""What an engine keeps per run, bounded.

An engine keeps a little of each run in flight (its hydrated ``aaa.run.started``, its
rebuilt algorithm, its end): what is kept per run is dropped when the run's end is
delivered (:meth:`Engine.forget <aaa_django.runtime.Engine.forget>`), and each map is
bounded, the oldest entry dropped first (a long-lived worker serves any number of
runs). The bounds are read at each use: a test lowers them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

#: a bounded map's key, and its value
K = TypeVar("K")
V = TypeVar("V")

#: runs in flight one engine keeps what it needs of (each map below that is per run is
#: as large, as are the logs its tail keeps, ``aaa_django.events.tail.MAX_STREAMS``):
#: past it, the runs in flight push each other's state out and each turn reads it back
#: (benchmarks/bench_concurrency.py at 3,000 and 10,000 runs)
RUNS_KEPT = 16_384
#: runs whose hydrated ``aaa.run.started`` is kept
STARTED_KEPT = RUNS_KEPT
#: runs whose rebuilt algorithm is kept (a pure function of the started event), and
#: distinct (algorithm, config) instances
ALGORITHMS_KEPT = RUNS_KEPT
#: claim-checked events kept hydrated (their payloads read back from the blob store)
HYDRATED_KEPT = 256
#: runs whose end this engine delivered, remembered (their ids) so that a delivery of
#: one of them drops again what it read back (:meth:`Engine.delivered`)
ENDED_KEPT = 1024
#: runs whose ``aaa.run.completed`` this engine appended, kept: a wait for one of them
#: (woken by that append) has its outcome without reading the run back
COMPLETIONS_KEPT = RUNS_KEPT
#: results stepped on before their append (``Engine.answer``) whose delivery has not
#: come yet: it skips the step
STEPPED_KEPT = RUNS_KEPT


def keep(kept: OrderedDict[K, V], key: K, value: V, most: int) -> None:
    """``kept[key] = value`` as its newest entry; the oldest dropped past ``most``."""
    kept.pop(key, None)
    kept[key] = value
    if len(kept) > most:
        kept.popitem(last=False)
