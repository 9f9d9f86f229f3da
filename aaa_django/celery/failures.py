"""A delivery that fails: when it is tried again (:data:`REDELIVERY`), the fault as
the core classifies it (:func:`fault_of`), and giving up (:func:`give_up`: the run
ends ``failed``, naming the cause). Celery's task and the worker's loop share them.
"""

from __future__ import annotations

import logging

from aaa_django.runtime.engine_api import EngineAPI
from aaa_django.runtime.retry import Redelivery
from aaa_django.store.faults import translate

log = logging.getLogger("aaa_django.bus")


#: when an event whose delivery failed transiently is delivered again (by Celery's
#: retry of its task, or on the worker's loop once the task has handed it off)
REDELIVERY = Redelivery()


def fault_of(exc: BaseException) -> BaseException:
    """``exc`` as the core classifies it: a driver's error that no store boundary
    translated (Redis under a run's lock, the broker under a send) translated here."""
    return translate(exc) or exc


async def give_up(engine: EngineAPI, stream: str, seq: int, event_id: str, exc: BaseException, attempts: int) -> bool:
    """End the run ``failed``, naming the cause, because delivering its event at
    ``seq`` failed for good (:meth:`Engine.fail <aaa_django.runtime.Engine.fail>`).
    True if this ended it. A store that is down too leaves the run to the sweeper."""
    try:
        found = await engine.store.read(stream, after=seq - 1, limit=1)
        if not found or found[0].id != event_id:
            return False  # erased meanwhile: nothing to end
        return await engine.fail(stream, exc, event=found[0], attempts=attempts)
    except Exception:
        log.exception("could not record why run %s failed", stream)
        return False
