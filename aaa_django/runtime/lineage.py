"""The ids of a run's decisions, which a fork carries over (see :mod:`.fork`).

Every decision an algorithm makes (a request, a child run, its own events) gets a
deterministic id from the run's start and a key, so deciding the same thing twice
writes it once. A fork copies another run's decisions under ids of its own; it must
derive, for the same key, exactly the id its copy has. :func:`decision_id` does that
from the lineage the fork's ``aaa.run.started`` records.
"""

from __future__ import annotations

from aaa_django.events import Event, derive_id

#: the key of a fork's origin in its ``aaa.run.started`` data
FORKED_FROM = "forked_from"
#: what a fork's ids are derived as
FORK = "aaa.fork"


def decision_id(started: Event, *parts: object) -> str:
    """The id of a decision (``parts``: its type and key) of the run ``started`` starts.

    For an original run, ``derive_id(started.id, *parts)``; for a fork, the id the
    original run derived, carried through each fork of its lineage (the started ids
    of the runs the log came through): ``derive_id(<fork's start>, "aaa.fork", x)``
    for the ``x`` its origin derived, which is the id the fork gave its copy.
    """
    origin = started.data.get(FORKED_FROM)
    if not origin:
        return derive_id(started.id, *parts)
    lineage = list(origin["lineage"])
    x = derive_id(lineage[0], *parts)
    for ancestor in lineage[1:]:
        x = derive_id(ancestor, FORK, x)
    return derive_id(started.id, FORK, x)
