"""A warm shutdown (SIGTERM) of a worker whose loop holds model calls after their tasks
have returned: Celery does not wait for those calls, the worker's own
drain does (``AAA["WORKER_DRAIN_SECONDS"]``, :meth:`WorkerRuntime.drain`).

- Within the bound, the calls end and what they append goes through the broker: the
  other worker finishes every run, with no sweeper at all.
- Past it (a bound of 0 here), the worker releases the busy leases of the calls it
  still holds, and its leases on their runs, as it exits: the moment it is gone no
  run is marked busy (after a SIGKILL they stay busy until ``LEASE_TTL``), and the
  next duty pass adopts them (or the sweeper re-drives them).

Either way every run ends ``success`` with a log that lost and duplicated nothing.
What the drain decided is read from its record in the worker's log.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter

from aaa_django.celery.sweeper import sweep
from aaa_django.runtime.event_types import (
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_REQUESTED,
)

from .conftest import CELERY_DB, make_engine
from .person import reconciling
from .site import loop, script
from .test_calls_in_flight import _adopted, _calls
from .test_faults import REQUEST_TYPES, _as_it_happened, _each_request_has_one_result, _executions

pytestmark = [CELERY_DB]

RUNS, TURNS, LATENCY = 30, 2, 2.0
#: model calls in flight when the worker is stopped, at least
HELD = 5
DRAIN = re.compile(
    r"worker shutdown: (\d+) deliveries in flight, (\d+) finished, (\d+) left, "
    r"(\d+) busy leases released"
)


def _drains(worker) -> list[tuple[int, ...]]:
    """The drain records a worker's processes logged as they shut down."""
    return [tuple(map(int, m.groups())) for m in DRAIN.finditer(worker.log_file.read_text(errors="replace"))]


def _stop_holding_calls(new_cluster, arun, *, drain_seconds: str, other: str):
    """Start RUNS runs, SIGTERM a worker while it holds model calls; ``other``: "running"
    (a second worker is started once the first holds them, and runs before it stops) or
    "restarted" (another starts once it is gone, and the sweeper runs). Returns (drain
    records, runs busy once the worker was gone, runs re-driven by the sweeper,
    outcomes, logs)."""
    import threading

    import redis as redis_py

    from aaa_django.celery.bus import coordinator

    sweeper = other == "restarted"
    # One worker at first, in both cases: the calls held are all its own. (With a second
    # worker running from the start, that one could take every call; the stopped
    # worker's drain then had nothing to wait for, and no call of its own came while
    # the calls were held: the test waited out its bound in CI.)
    cluster = new_cluster(
        1,
        suffix=f"-drain{drain_seconds}",
        concurrency=2,
        env={"AAA_TEST_DRAIN_SECONDS": drain_seconds},
    )
    worker = cluster.workers[0]
    # The model calls are held until the worker's drain has begun (within the bound:
    # they end during the drain) or the worker is gone (past it): either way the drain
    # finds them in flight, however long a loaded machine takes to get its pool
    # children there.
    r = redis_py.Redis.from_url(cluster.env["AAA_TEST_CELERY_BROKER"])
    hold = f"aaa-test:hold:drain{drain_seconds}"
    r.set(hold, 1)
    task = script(turns=TURNS, tool="record", latency=LATENCY, hold=hold)
    redriven: list[str] = []

    async def sweep_every_second(engine, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(1)
            redriven.extend((await sweep(engine, stall_after=2)).redriven)

    async def main():
        async with make_engine(cluster.queues) as engine:
            runs = await asyncio.gather(*(engine.start(loop(), {"task": task}) for _ in range(RUNS)))
            ids = [r.run_id for r in runs]
            while True:
                asked, answered = await asyncio.to_thread(_calls)
                if asked >= RUNS // 2 and asked - answered >= HELD:
                    break
                await asyncio.sleep(0.02)
            # ...and the held calls hold their runs' leases (a model call takes it
            # after SLOW_CALL): what a drain past its bound gives up
            leased = lambda: sum(map(coordinator().is_busy, ids))  # noqa: E731
            while await asyncio.to_thread(leased) < 1:
                await asyncio.sleep(0.1)
            if not sweeper:  # the other worker, running before this one stops
                await asyncio.to_thread(cluster.start, 1, concurrency=2)

            # Warm shutdown; far longer than the drain's bound (a worker that had to be
            # killed logs no record, and the test fails on that)
            def release_once_draining() -> None:
                def watch() -> None:
                    for _ in range(1200):
                        if "worker shutdown: waiting up to" in worker.log_file.read_text(errors="replace"):
                            break
                        threading.Event().wait(0.05)
                    r.delete(hold)

                threading.Thread(target=watch, daemon=True).start()

            draining = release_once_draining if float(drain_seconds) > 0 else None
            await asyncio.to_thread(worker.stop, 60, signalled=draining)
            r.delete(hold)
            busy = await asyncio.to_thread(lambda: sum(map(coordinator().is_busy, ids)))
            if sweeper:
                await asyncio.to_thread(cluster.start, 1, concurrency=2)
            stop = asyncio.Event()
            helpers = [asyncio.ensure_future(reconciling(engine, stop, reconciled))]
            if sweeper:
                helpers.append(asyncio.ensure_future(sweep_every_second(engine, stop)))
            try:
                outcomes = await asyncio.gather(*(r.result() for r in runs))
            finally:
                stop.set()
                await asyncio.gather(*helpers)
            back = await asyncio.to_thread(_adopted, ids)
            return busy, outcomes, [await r.events() for r in runs], back

    reconciled: dict[str, str] = {}
    busy, outcomes, logs, adopted = arun(main(), timeout=150)
    drains = _drains(worker)
    print(
        f"\ndrains (in flight, finished, left, released): {drains}; {busy} runs busy after the stop; "
        f"{len(redriven)} re-drives, {adopted} runs adopted, {len(reconciled)} uncertain calls reconciled"
    )
    assert drains, f"the stopped worker logged no drain:\n{worker.tail()}"
    return drains, busy, len(redriven) + adopted, outcomes, logs


def _nothing_lost_or_duplicated(outcomes, logs) -> None:
    assert {o.outcome for o in outcomes} == {"success"}, Counter(o.outcome for o in outcomes)
    executions = _executions()
    for events in logs:
        assert Counter(e.type for e in events)[RUN_COMPLETED] == 1
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert len({e.id for e in events}) == len(events)
        _each_request_has_one_result(events)
        assert [e.data["tag"] for e in events if e.type == LLM_REQUESTED] == [f"turn-{t}" for t in range(1, TURNS + 1)]
        for request in (e for e in events if e.type == TOOL_REQUESTED):
            from aaa_django.events import derive_id

            (result,) = [e for e in events if e.causation == request.id and e.type in REQUEST_TYPES[TOOL_REQUESTED]]
            ran = executions.get(derive_id(request.id, "aaa.idempotency"), 0)
            assert ran <= 1, f"the guarded tool ran {ran} times for one call"
            _as_it_happened(result, ran)


def test_sigterm_waits_for_the_calls_in_flight(new_cluster, arun):
    drains, _, _, outcomes, logs = _stop_holding_calls(new_cluster, arun, drain_seconds="30", other="running")
    in_flight, finished, left, released = map(sum, zip(*drains))
    assert in_flight >= 1 and finished == in_flight  # it waited for every call it held...
    assert left == released == 0  # ...so it had no lease to give up
    # what the calls appended went through the broker: no sweeper here
    _nothing_lost_or_duplicated(outcomes, logs)


def test_sigterm_past_the_bound_releases_the_runs_at_once(new_cluster, arun):
    drains, busy, redriven, outcomes, logs = _stop_holding_calls(
        new_cluster, arun, drain_seconds="0", other="restarted"
    )
    in_flight, finished, left, released = map(sum, zip(*drains))
    assert left >= 1 and released >= 1  # it gave up calls that held their runs' leases...
    assert busy == 0  # ...and released them as it exited (not LEASE_TTL later)
    assert redriven  # those runs came back: adopted by the duty, or re-driven by the sweeper
    _nothing_lost_or_duplicated(outcomes, logs)
