"""A worker's memory stays flat across the runs it serves: what it keeps
per run (the run's log in the engine's tail, its folded states, its rebuilt
algorithm) is dropped when the run ends, every cache has a bound, and with DEBUG on
its store threads keep no log of their queries.

The worker is built as ``aaa.deliver`` builds it (``WorkerRuntime.engine``: the
site's store on PostgreSQL, its calls on the runtime's threads, the settings'
``WORKER_SETUP``), for a process that consumes every queue: each event a run appends
is delivered on the worker's loop (as a worker delivers what it appends), with the
settings of the example site's worker (``DEBUG`` on). It serves 5,000 one-turn
ToolLoop runs one after another (a scripted model, no latency); its resident memory
after run 5,000 is within 10 MB of what it was after run 500.

What it guards: DEBUG's log of the queries on the store's threads would keep 4.2 KB
a run (18.4 MB from run 500 to run 5,000), and the run leases' own connection's log
(a claim a run) 1.6 MB more; a self-check, or a delivery, that reads a run while, or
after, its end is delivered would leave the run in the tail (61 of the 5,000), and the
store would keep its hint. The engine's per-run maps are bounded at ``KEPT`` here, so
they are full by run 1,024 (at their own bound, 16,384, they would still be filling
at run 5,000). As it is: 2.0-5.2 MB, no ended run in the tail, no hint of one. A real
prefork child of ``celery worker`` (DEBUG off, runs started by another process through
Redis): 1.45 MB from run 500 to 3,000.
"""

from __future__ import annotations

import gc
import os
import threading

import pytest
from celery import Celery
from django.db import connections
from django.test import override_settings

from aaa_django.algos import ToolLoop
from aaa_django.celery.bus import store_spec
from aaa_django.celery.engines import DB_THREADS
from aaa_django.celery.worker import WorkerRuntime
from aaa_django.events import Event, default_cache
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text
from aaa_django.runtime import bounded
from aaa_django.store import DjangoEventStore
from aaa_django.store.offload import OnThreads
from aaa_django.store.postgres import site_store

pytestmark = [
    pytest.mark.django_db(databases=["default", "postgres"], transaction=True),
    pytest.mark.postgres,
    pytest.mark.redis,
]

RUNS, WARM = 5_000, 500


def setup(engine) -> None:
    """The ``WORKER_SETUP`` of these tests: a model that answers at once."""
    LLMHandler(FakeLLMClient(lambda request: text("done"))).attach(engine)


def rss() -> int:
    """This process's resident memory, in bytes (Linux)."""
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


#: the queues of these tests' worker (and of nobody else's)
QUEUES = {kind: f"aaa.{kind}-memory" for kind in ("algorithms", "llm", "tools")}


def worker_settings(redis_url: str) -> override_settings:
    return override_settings(
        DEBUG=True,
        AAA={"BUS": "celery", "REDIS_URL": redis_url, "CELERY_QUEUES": QUEUES, "WORKER_SETUP": f"{__name__}.setup"},
    )


#: the bound of what an engine keeps per run, for these tests: a worker keeps up to
#: ``bounded.RUNS_KEPT`` (16,384) runs' started events, algorithms and ends, filling as
#: it serves its first runs; at 1,024 they are full by run 1,024, and from there the
#: memory must stay flat (what grows past them is a leak)
KEPT = 1024


@pytest.mark.campaign
def test_a_workers_memory_is_flat_across_5000_runs(pg_alias, redis_url, monkeypatch):
    # The fold holder's self-checks come due all along and wait for an idle process:
    # the checks of a run that ended go with its states, so nothing piles up.
    for bound in ("STARTED_KEPT", "ALGORITHMS_KEPT", "COMPLETIONS_KEPT", "STEPPED_KEPT"):
        monkeypatch.setattr(bounded, bound, KEPT)
    with worker_settings(redis_url):
        rt = WorkerRuntime()
        try:
            # The Celery app of a worker started with -Q naming every queue.
            app = Celery("memory-test", set_as_current=False)
            app.amqp.queues.select(list(QUEUES.values()))
            engine = rt.engine(store_spec(site_store(pg_alias)), app)
            algorithm = ToolLoop(max_turns=2)
            runs: list[str] = []

            async def serve(count: int) -> None:
                for _ in range(count):
                    runs.append((await engine.start(algorithm, {"task": "answer"})).run_id)
                    await rt.idle()

            rt.run(serve(WARM))
            warm = rss()
            rt.run(serve(RUNS - WARM))
            grown = rss() - warm
            held = {
                run_id: [e.type for e in rt.run(engine.store.read(run_id))]
                for run_id in runs
                if engine.tail.cached(run_id, 1) is not None
            }
            # nor the store a hint of one's head and row (they are kept for the runs in
            # flight: an engine's tail's worth)
            hinted = [run_id for run_id in runs if engine.tail.inner.hint(run_id) is not None]
            outcome = rt.run(engine.outcome(runs[-1]))
        finally:
            rt.close()

    assert outcome.outcome == "success"
    assert rt.taken == 6 * RUNS  # every event delivered on the worker's loop, none sent (the model call's attempt too)
    assert grown < 10 * 2**20, f"grew {grown / 2**20:.1f} MB from run {WARM} to run {RUNS}"
    assert held == {}  # the tail keeps nothing of an ended run
    assert hinted == []
    # nor the holder a self-check of one (the holder is the process's: another test on
    # this pytest worker may have left checks of its own runs)
    assert default_cache.due_streams() & set(runs) == set()


def test_with_debug_on_the_store_threads_keep_no_log_of_their_queries(pg_alias):
    rt = WorkerRuntime()
    store = DjangoEventStore(pg_alias, offload=OnThreads(rt.db, pg_alias))
    everyone = threading.Barrier(DB_THREADS, timeout=10)

    def logged() -> int:  # on each of the threads at once
        everyone.wait()
        return len(connections[pg_alias].queries_log)

    try:
        with override_settings(DEBUG=True):
            for i in range(4 * DB_THREADS):
                rt.run(store.append([Event.new(f"stream-{i}", "test.happened", {"i": i})]))
            counts = [done.result() for done in [rt.db.submit(logged) for _ in range(DB_THREADS)]]
    finally:
        rt.close()

    assert counts == [0] * DB_THREADS
