"""Crash and resume, for every algorithm: drop the engine after any number of appended
events; a new engine on the same store finishes the run exactly as an uninterrupted
one did (same events, id for id), but for a model attempt the crash cut off (recorded
abandoned, and made again). Only the log carries the run across the crash."""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.events import InMemoryEventStore
from tests.runtime.helpers import CrashingStore, arun, check_resumed

from .scenarios import GOLDEN, RUN

REFERENCE = {name: arun(case(False)) for name, case in GOLDEN.items()}


async def crash_then_resume(case, k: int):
    store = InMemoryEventStore()
    crashing = CrashingStore(store, k)
    first = case.engine(store=crashing)
    await first.start(case.build(), case.input, run_id=RUN, **case.start)
    done = asyncio.ensure_future(first.run(RUN).result())
    await asyncio.wait(
        {done, asyncio.ensure_future(crashing.crashed.wait())}, return_when=asyncio.FIRST_COMPLETED, timeout=10
    )
    await first.close(drain=False)  # the process is gone: nothing in flight survives
    done.cancel()
    # A batch is appended whole or not at all (FSM: a state and its action; a fan-out:
    # all its requests), so a cut inside one leaves the log at the batch before it.
    cut = await store.read(RUN)
    assert len(cut) <= k
    async with case.engine(store=store) as second:
        adopted = await second.resume()
        outcome = await second.run(RUN).result(timeout=10)
        await second.drain(5)
        return adopted, outcome, await store.read(RUN), cut


CUTS = [(name, k) for name in sorted(GOLDEN) for k in range(1, len(REFERENCE[name].log))]


@pytest.mark.parametrize("name, k", CUTS, ids=[f"{n}-{k}" for n, k in CUTS])
def test_resume_after_crash_at_every_cut_point(name, k):
    ref = REFERENCE[name]
    adopted, outcome, log, cut = arun(crash_then_resume(GOLDEN[name], k))
    assert adopted == [RUN]
    assert outcome == ref.outcome
    check_resumed(log, cut, ref.log)
