"""Whether this process still holds a run: the question a handler asks before it pays
for a call.

A bus that knows which process holds each run (a lease renewed while the process lives)
offers :class:`HoldsRuns`; a handler detects it once, where it is attached, and asks
:func:`holds` before each provider call and before it calls another process's call
abandoned. A bus without it (the in-process bus: its process is the only one driving
its runs) holds every run it delivers.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class HoldsRuns(Protocol):
    """A bus that says whether this process still holds run ``run_id``: True only while
    no other live process holds it (one holder at a time, on a lease its process
    renews: a new holder takes a run over once the old one's lease lapsed). False:
    another process took it over, or this one lost its lease (cut off from the
    cluster): make no call for it. On such a bus a handler needs no lease of its own
    per call: in the run's one holder, the handler knows its calls in flight."""

    async def holds(self, run_id: str) -> bool: ...


async def holds(holder: HoldsRuns | None, run_id: str) -> bool:
    """``holder.holds(run_id)``; True without a holder (a bus that does not say)."""
    return True if holder is None else await holder.holds(run_id)
