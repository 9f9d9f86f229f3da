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

#: runs whose hydrated ``aaa.run.started`` is kept
STARTED_KEPT = 4096
#: runs whose rebuilt algorithm is kept (a pure function of the started event), and
#: distinct (algorithm, config) instances
ALGORITHMS_KEPT = 1024
#: claim-checked events kept hydrated (their payloads read back from the blob store)
HYDRATED_KEPT = 256
#: runs whose end this engine delivered, remembered (their ids) so that a delivery of
#: one of them drops again what it read back (:meth:`Engine.delivered`)
ENDED_KEPT = 1024
#: runs whose ``aaa.run.completed`` this engine appended, kept: a wait for one of them
#: (woken by that append) has its outcome without reading the run back
COMPLETIONS_KEPT = 4096
#: results stepped on before their append (``Engine.answer``) whose delivery has not
#: come yet: it skips the step
STEPPED_KEPT = 4096


def keep(kept: OrderedDict[K, V], key: K, value: V, most: int) -> None:
    """``kept[key] = value`` as its newest entry; the oldest dropped past ``most``."""
    kept.pop(key, None)
    kept[key] = value
    if len(kept) > most:
        kept.popitem(last=False)
