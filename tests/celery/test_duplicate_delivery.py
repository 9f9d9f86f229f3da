"""A second delivery of a guarded tool call that is still running leaves it alone.

At-least-once delivery may hand a tool request to a second worker while the first
still runs the call (a redelivery, a re-drive). The call's intent is in the log and
its result is not yet: the second delivery waits on the call's lease (held by the
first) and then finds the result, instead of recording ``failed: uncertain``, which
would have won over the call's real result. ``uncertain`` stays for an intent whose
holder is gone (tests/celery/test_faults.py SIGKILLs it).
"""

from __future__ import annotations

import asyncio
import time

from aaa_django.events import derive_id
from aaa_django.runtime.event_types import TOOL_COMPLETED, TOOL_FAILED, TOOL_REQUESTED

from .conftest import CELERY_DB, make_engine
from .site import loop, script
from .test_faults import _executions

pytestmark = [CELERY_DB]


def test_a_duplicate_delivery_of_a_running_guarded_call_does_not_make_it_uncertain(cluster, arun, redis):
    task = script(turns=2, tool="slow_record", args={"tag": "dup-a", "seconds": 3})

    async def main():
        async with make_engine() as engine:
            run = await engine.start(loop(), {"task": task})
            end = time.monotonic() + 30
            while not redis.get("aaa-test:dup-a:started"):  # the call is running
                assert time.monotonic() < end, "the guarded tool never started"
                await asyncio.sleep(0.02)
            (request,) = [e for e in await run.events() if e.type == TOOL_REQUESTED]
            await engine.bus.publish([request])  # delivered again, to another worker
            return await run.result(timeout=60), await run.events()

    outcome, events = arun(main())

    (request,) = [e for e in events if e.type == TOOL_REQUESTED]
    (result,) = [e for e in events if e.causation == request.id and e.type in (TOOL_COMPLETED, TOOL_FAILED)]
    assert (result.type, result.data.get("reason")) == (TOOL_COMPLETED, None), result.data
    assert result.data["result"] == "recorded 0 slowly"
    assert _executions()[derive_id(request.id, "aaa.idempotency")] == 1  # it ran once
    assert outcome.outcome == "success"
