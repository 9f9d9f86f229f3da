"""A worker's delivery, without Celery: the loop thread, the store queries made on it,
a message that carries its event (no read to catch up), the step's guarded appends,
what a step publishes sent at once (no run lock is held in the common case), and a
call handed off (the task returns while it waits on the loop).

``deliver_event`` is called as the ``aaa.deliver`` task calls it (on a
``WorkerRuntime``); what the bus would send to the broker is kept in a list instead,
with whether the run's lock was held at that moment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import uuid
from dataclasses import replace

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.db.backends.signals import connection_created

from aaa_django.celery.bus import DistributedBus
from aaa_django.celery.coordination import Coordinator
from aaa_django.celery.delivering import deliver_event
from aaa_django.celery.engines import build_worker_engine
from aaa_django.celery.worker import WorkerRuntime
from aaa_django.events import Event, FoldCache
from aaa_django.events.tail import TailCachedStore
from aaa_django.models import RunRecord
from aaa_django.runtime.event_types import (
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
)
from aaa_django.runtime.observe import BaseObserver
from aaa_django.site.engines import build_engine
from aaa_django.store import DjangoEventStore
from aaa_django.store.offload import OnThreads
from tests.scenarios import site

pytestmark = [
    pytest.mark.django_db(databases=["default", "postgres"], transaction=True),
    pytest.mark.postgres,
    pytest.mark.redis,
]


class StoreThread:
    """One thread that makes the sync calls of the tests' Django stores (``offload``,
    as a worker's db threads make them), so that its one connection sees every
    statement they make; ``call(fn)`` runs ``fn`` there too."""

    def __init__(self, using: str) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="test-store")
        self.offload = OnThreads(self.executor, using)
        self.ident = self.call(threading.get_ident)

    def call(self, fn):
        return self.executor.submit(fn).result()

    def store(self, using: str) -> DjangoEventStore:
        return DjangoEventStore(using, offload=self.offload)

    def close(self) -> None:
        self.call(connections.close_all)
        self.executor.shutdown()


@pytest.fixture
def db_thread(pg_alias):
    thread = StoreThread(pg_alias)
    yield thread
    thread.close()


@pytest.fixture
def worker(pg_alias, redis_url, db_thread):
    """A runtime and an engine built as a worker builds them, on a Django store whose
    sync calls run on ``db_thread``; sends are recorded."""
    rt = WorkerRuntime()
    coord = Coordinator(redis_url, prefix=f"test-{id(rt)}")
    store = TailCachedStore(db_thread.store(pg_alias))
    engine = build_engine(
        using=pg_alias, store=store, cache=FoldCache(), bus=DistributedBus(in_worker=True, coordinator=coord)
    )
    site.PROBE = site.MemoryProbe()
    site.attach(engine)
    sent: list[dict] = []

    def send(messages, ended, *, swallow=True):
        held = [m[1][1] for m in messages if coord.client.exists(coord.key("lock", m[1][1]))]
        sent.append(
            {"messages": [m[1] for m in messages], "ended": list(ended), "held": held, "thread": threading.get_ident()}
        )

    engine.bus._send = send
    try:
        yield rt, engine, sent
    finally:
        rt.close()


def beside(engine, store, pg_alias: str, *, cache: FoldCache | None = None, **kw):
    """Another worker's engine, built as the ``worker`` fixture's is, on ``store`` (a
    Django store): its bus shares the fixture's coordinator (Redis leases and locks)
    and records what it sends with the fixture's sends."""
    built = build_engine(
        using=pg_alias,
        store=TailCachedStore(store),
        cache=cache if cache is not None else FoldCache(),
        bus=DistributedBus(in_worker=True, coordinator=engine.bus.coordinator),
        **kw,
    )
    built.bus._send = engine.bus._send
    return built


def drive(rt, engine, sent, each=None) -> int:
    """Deliver every message sent, in order, as the workers would; returns how many.
    ``each(seq)`` is called before each delivery."""
    done = 0
    while done < sum(len(s["messages"]) for s in sent):
        spec, stream, seq, event_id, *wire = [m for s in sent for m in s["messages"]][done]
        if each is not None:
            each(seq)
        assert rt.run(deliver_event(engine, stream, seq, event_id, wire=wire[0] if wire else None)) == "delivered"
        done += 1
    return done


#: how the call of the append function (migration 0009) starts
APPEND_CALL = "SELECT aaa_append_event("


def kind(sql: str) -> str:
    """A store statement, told apart: "CALL" (the append function's), else its first word."""
    return "CALL" if sql.startswith(APPEND_CALL) else sql.split()[0]


def one_statement_each(statements: dict[int, list[str]], events: list[Event]) -> bool:
    """Every delivery appended in one statement, no query: the append function's call
    (one event, on the worker's Django connection, which prepares nothing), or the
    insert-and-update statement (a batch); and some deliveries appended one event. A
    model request's delivery appends twice: the call's attempt before it is sent, and
    its result."""
    asks = {e.seq for e in events if e.type == LLM_REQUESTED}
    return (
        all(kinds in ((["CALL"] * 2,) if seq in asks else (["CALL"], ["WITH"])) for seq, kinds in statements.items())
        and ["CALL"] in statements.values()
    )


def test_a_run_delivered_on_the_loop_its_store_calls_on_the_db_thread(worker, pg_alias, db_thread):
    rt, engine, sent = worker
    queries: list[int] = []

    def count(execute, sql, params, many, context):
        queries.append(threading.get_ident())
        return execute(sql, params, many, context)

    # the store queries on its db thread, on that thread's connection
    db_thread.call(lambda: connections[pg_alias].execute_wrappers.append(count))
    run_id = rt.run(_start(engine))
    deliveries = drive(rt, engine, sent)
    outcome = rt.run(engine.outcome(run_id))

    assert outcome.outcome == "success" and outcome.value == {"text": "1 + 2 = 3"}
    events = rt.run(engine.store.read(run_id))
    assert deliveries == len(events)
    assert set(queries) == {db_thread.ident}
    assert {s["thread"] for s in sent} == {rt.thread.ident}  # sent from the loop
    # nothing was sent while the run's lock was held: the next delivery never waits
    assert [s["held"] for s in sent] == [[]] * len(sent)
    assert sent[-1]["ended"] == [run_id]


def test_a_worker_holds_no_timer_for_a_run_that_waits(worker, pg_alias):
    """A run's deadline is a column of its index row, which the workers' duty reads
    (aaa_django.celery.duty): the worker's engine keeps no timer and sends nothing for it."""
    rt, engine, sent = worker

    async def start():
        run = await engine.start("tests.reader", {}, deadline=3600)  # waits for an event
        return run.run_id, (await run.meta()).deadline

    run_id, deadline = rt.run(start())
    deliveries = drive(rt, engine, sent)

    assert engine.timers() == {}
    assert deliveries == len(rt.run(engine.store.read(run_id)))  # one message per event, no more
    assert RunRecord.objects.using(pg_alias).get(pk=run_id).due_at == deadline


def test_what_a_step_appends_is_sent_in_one_batch_after_the_lock(worker):
    rt, engine, sent = worker

    async def start():
        return (await engine.start(site.FanOut(tool="noop", n=5), {})).run_id

    run_id = rt.run(start())
    drive(rt, engine, sent)

    assert rt.run(engine.outcome(run_id)).outcome == "success"
    fan_out = [s for s in sent if len(s["messages"]) > 1]
    assert len(fan_out) == 1 and len(fan_out[0]["messages"]) == 5  # one batch, one producer
    assert all(not s["held"] for s in sent)


def test_a_delivery_makes_one_statement_and_no_query(worker, pg_alias, db_thread):
    """A message carries the event it delivers (with the id of the one before it):
    the worker's cached view of the run is current without a read, and the append is
    one statement. A re-drive (no event in the message) reads once and writes nothing
    when nothing is left to do."""
    rt, engine, sent = worker
    statements: dict[int, list[str]] = {}
    current: list[int] = []

    def record(execute, sql, params, many, context):
        # (a first read of a projection also looks for a snapshot)
        if "aaa_event" in sql or sql.startswith(APPEND_CALL):
            statements.setdefault(current[-1], []).append(kind(sql))
        return execute(sql, params, many, context)

    run_id = rt.run(_start(engine))
    db_thread.call(lambda: connections[pg_alias].execute_wrappers.append(record))
    assert all(len(m) == 5 for s in sent for m in s["messages"])  # every one carries its event
    drive(rt, engine, sent, each=current.append)
    current.append(0)  # (the test's own reads)
    events = rt.run(engine.store.read(run_id))
    assert events[-1].type == RUN_COMPLETED
    assert statements.pop(0) == ["SELECT"]
    # each delivery appends once, without a query (the start made the run's row and
    # left its head); the end's appends nothing, nor does a model call's attempt's
    assert sorted(statements) == [e.seq for e in events[:-1] if e.type != LLM_ATTEMPTED]
    assert one_statement_each(statements, events)

    statements.clear()
    current.append(3)
    assert rt.run(deliver_event(engine, run_id, 3, events[2].id)) == "delivered"
    assert statements == {3: ["SELECT"]}  # a re-drive: one read, nothing left to do
    assert rt.run(engine.store.read(run_id)) == events
    assert rt.run(deliver_event(engine, run_id, 3, "not-that-event")) == "missing"


def test_a_delivery_whose_current_view_lacks_its_own_event_asks_before_calling_it_missing(worker, pg_alias, caplog):
    """A delivery taken on the loop is told its view is current (the tail holds the
    event). Should that view lack the event anyway, the delivery reads the log again
    before it calls the event missing: "missing" drops the delivery, and its run would
    wait for the sweeper (the field's 200 runs: a tail that installed an older view of
    a log its appends had extended, tests/events/test_eventstore_tailcache.py)."""
    rt, engine, sent = worker
    run_id = rt.run(_start(engine))
    event = rt.run(engine.store.read(run_id))[0]
    read = engine.store.read
    blinks: list[int] = []

    async def blinking(stream, **kwargs):
        if kwargs.get("limit") == 1 and not blinks:
            blinks.append(1)
            return []  # the view without its event, once
        return await read(stream, **kwargs)

    engine.store.read = blinking
    try:
        with engine.tail.delivery():
            assert engine.tail.holds(event)
        assert rt.run(deliver_event(engine, run_id, event.seq, event.id, event=event)) == "delivered"
    finally:
        del engine.store.read
    assert blinks == [1]
    # said in the log: a view that lacks its own event is a bug of the tail's
    assert any(
        "lacked it; reading the run again" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records
    )


def test_a_run_started_elsewhere_is_delivered_without_a_query(worker, pg_alias, db_thread):
    """The web process's start travels with its message (its store just appended it):
    a worker that never saw the run takes the start as the run's log, and knows the
    run's row from it, so its first append is one statement too."""
    rt, engine, sent = worker
    web = build_engine(
        using=pg_alias, store=DjangoEventStore(pg_alias), bus=DistributedBus(coordinator=engine.bus.coordinator)
    )
    web.bus._send = engine.bus._send  # (recorded with the worker's own sends)
    statements: dict[int, list[str]] = {}
    current: list[int] = []

    def record(execute, sql, params, many, context):
        if "aaa_event" in sql or "aaa_run" in sql or sql.startswith(APPEND_CALL):
            statements.setdefault(current[-1], []).append(kind(sql))
        return execute(sql, params, many, context)

    run_id = async_to_sync(_start)(web)
    assert len(sent[0]["messages"][0]) == 5  # the start's message carries it
    db_thread.call(lambda: connections[pg_alias].execute_wrappers.append(record))
    drive(rt, engine, sent, each=current.append)
    current.append(0)  # (the test's own reads)
    assert rt.run(engine.outcome(run_id)).outcome == "success"
    events = rt.run(engine.store.read(run_id))
    statements.pop(0)
    # (the end's delivery appends nothing, nor does a model call's attempt's)
    assert sorted(statements) == [e.seq for e in events[:-1] if e.type != LLM_ATTEMPTED]
    assert one_statement_each(statements, events)


def test_two_workers_taking_turns_never_read(worker, pg_alias, redis_url, db_thread):
    """Two workers take a run's deliveries in turn (as two Celery workers do): the
    second first sees the run at its second event, whose message carries the run's
    first event too (a young run's messages carry the events before them), so no
    delivery reads the log and each appends in one statement."""
    rt, engine, sent = worker
    other = beside(engine, db_thread.store(pg_alias), pg_alias)
    site.attach(other)
    statements: dict[int, list[str]] = {}
    current: list[int] = []

    def record(execute, sql, params, many, context):
        if "aaa_event" in sql or "aaa_run" in sql or sql.startswith(APPEND_CALL):
            statements.setdefault(current[-1], []).append(kind(sql))
        return execute(sql, params, many, context)

    run_id = rt.run(_start(engine))
    db_thread.call(lambda: connections[pg_alias].execute_wrappers.append(record))
    done = turns = 0
    while done < sum(len(s["messages"]) for s in sent):
        spec, stream, seq, event_id, *wire = [m for s in sent for m in s["messages"]][done]
        current.append(seq)
        turn = (engine, other)[turns % 2]
        assert rt.run(deliver_event(turn, stream, seq, event_id, wire=wire[0] if wire else None)) == "delivered"
        done += 1
        # (a model call appends its attempt and then its result: the worker that takes
        # the attempt's delivery takes the result's too, as the one that made both)
        if json.loads(wire[0])[1]["type"] != LLM_ATTEMPTED:  # (the message carries the event)
            turns += 1
    syncs = (engine.store.syncs, other.store.syncs)
    current.append(0)
    events = rt.run(engine.store.read(run_id))
    statements.pop(0, None)
    assert events[-1].type == RUN_COMPLETED and done == len(events)
    assert one_statement_each(statements, events)
    assert syncs == (0, 0)  # no delivery caught up with the log by reading it


def test_a_message_whose_event_does_not_follow_the_cache_is_read(worker, pg_alias, db_thread):
    """The cache takes a carried event only when it holds the event before it (same
    id): a message naming another predecessor makes the worker read instead."""
    rt, engine, sent = worker
    run_id = rt.run(_start(engine, "once:deploy"))
    drive(rt, engine, sent)  # up to its approval gate: the worker's cache holds its log
    other = DjangoEventStore(pg_alias)
    stored = db_thread.call(lambda: other.append_sync([Event.new(run_id, "tests.other.appended", {})]))[0]
    wire = json.dumps([str(uuid.uuid4()), stored.to_dict()])  # claims a predecessor it does not have
    store: TailCachedStore = engine.store
    syncs = store.syncs
    assert rt.run(deliver_event(engine, run_id, stored.seq, stored.id, wire=wire)) == "delivered"
    assert store.syncs == syncs + 1  # read, not taken from the message
    assert rt.run(store.read(run_id)) == db_thread.call(lambda: DjangoEventStore(pg_alias).read_sync(run_id))


def test_an_append_after_another_process_appended_still_lands(worker, pg_alias, db_thread):
    """What the last read saw is only a starting point: had another process appended
    since, the statement is refused and the append asks for the head."""
    rt, engine, sent = worker
    run_id = rt.run(_start(engine))
    rt.run(engine.store.read(run_id))  # the worker's view: the start alone
    other = DjangoEventStore(pg_alias)  # another process
    db_thread.call(lambda: other.append_sync([Event.new(run_id, "tests.other.appended", {})]))
    rt.run(engine.store.append([Event.new(run_id, "tests.worker.appended", {})]))
    events = rt.run(db_thread.store(pg_alias).read(run_id))
    assert [e.type for e in events] == [RUN_STARTED, "tests.other.appended", "tests.worker.appended"]
    assert [e.seq for e in events] == [1, 2, 3]
    row = db_thread.call(lambda: RunRecord.objects.using(pg_alias).get(pk=run_id))
    assert row.last_seq == 3
    # an event stored already (a step decided again): absorbed, as by any append
    for again in (replace(events[1], seq=None), events[1]):
        rt.run(engine.store.read(run_id))
        assert rt.run(engine.store.append([again])) == []
        assert rt.run(db_thread.store(pg_alias).read(run_id)) == events


def test_a_toolloop_turn_in_a_worker_is_its_appends_and_no_read_of_them(worker, pg_alias, db_thread):
    """As in-process (tests/runtime/test_store_calls.py): a worker that takes every
    delivery of a run holds its log, so a turn is its appends."""
    from aaa_django.algos import ToolLoop
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.tools import ToolHandler, ToolRegistry
    from tests.runtime.test_store_calls import TURNS, count_calls, model, noop

    rt, engine, sent = worker
    store = db_thread.store(pg_alias)
    counted = count_calls(store)
    mine = beside(engine, store, pg_alias, cache=FoldCache(check_every=0))
    registry = ToolRegistry([noop])
    LLMHandler(FakeLLMClient(model)).attach(mine)
    ToolHandler(registry).attach(mine)

    async def start():
        return (await mine.start(ToolLoop(registry, max_turns=TURNS + 1), {"task": "count"})).run_id

    run_id = rt.run(start())
    drive(rt, mine, sent)
    calls = list(counted)
    assert rt.run(mine.outcome(run_id)).outcome == "success"
    methods = [name for name, _ in calls]
    assert methods.count("append") == 2 + 4 * TURNS - 2 + 1 + TURNS, calls  # (+ each call's attempt)
    assert len(calls) / TURNS <= 6
    assert set(methods) <= {"append", "save_snapshot"}, calls


def test_a_worker_that_takes_its_runs_deliveries_appends_a_result_with_its_step(worker, pg_alias, db_thread):
    """A worker that takes every queue delivers what it appends on its own loop
    (``WorkerRuntime.take``) and steps on a handler's result before appending it
    (``WorkerRuntime.steps_here``, ``Engine.answer``): a turn is two appends, as
    in-process, and no message is sent; the log is the one a run of results appended
    alone writes, id for id. Told that a request appended here is delivered here
    (``WorkerRuntime.takes``, as a worker's bus is), it records each model call's first
    attempt in the request's append, holding the attempt's lease from before it: the
    same log again, a model call's append fewer, and no lease left held."""
    from aaa_django.algos import ToolLoop
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.tools import ToolHandler, ToolRegistry
    from tests.runtime.test_store_calls import TURNS, count_calls, model, noop

    rt, engine, sent = worker

    def one_run(answers: bool, takes: bool = False) -> tuple[list[str], list[tuple[str, str]], int]:
        store = db_thread.store(pg_alias)
        counted = count_calls(store)
        mine = beside(engine, store, pg_alias, cache=FoldCache(check_every=0), answers=answers)
        rt.local_queues = frozenset(mine.bus.queues.values())
        mine.bus.local = rt.take
        mine.bus.local_steps = lambda e: rt.steps_here(mine, e)
        if takes:
            mine.bus.local_takes = lambda e: rt.takes(mine, e)
        registry = ToolRegistry([noop])
        LLMHandler(FakeLLMClient(model)).attach(mine)
        ToolHandler(registry).attach(mine)

        class Ended(BaseObserver):
            """Set once the run's end is appended (a wait would read the store)."""

            def __init__(self) -> None:
                self.ended = asyncio.Event()

            async def appended(self, events) -> None:
                if any(e.type == RUN_COMPLETED for e in events):
                    self.ended.set()

        async def go():
            ended = mine.observe(Ended())
            run = await mine.start(
                ToolLoop(registry, max_turns=TURNS + 1), {"task": "count"}, run_id=f"run-local-{answers}-{takes}"
            )
            await asyncio.wait_for(ended.ended.wait(), 30)
            calls = list(counted)
            assert (await mine.outcome(run.run_id)).outcome == "success"
            return calls, [(e.type, e.id) for e in await mine.store.read(run.run_id)]

        try:
            calls, log = rt.run(go())
        finally:
            rt.run(mine.close())
        return [name for name, _ in calls], log, mine.bus.sent

    answered, answered_log, sent_answered = one_run(True)
    alone, alone_log, sent_alone = one_run(False)
    taken, taken_log, sent_taken = one_run(True, takes=True)
    assert sent_answered == sent_alone == sent_taken == 0  # every delivery taken on the loop
    # the start; the verdict with the first request; two a turn; the last reply with the
    # end; and each model call's attempt, before it is sent
    assert answered.count("append") == 1 + 1 + 2 * (TURNS - 1) + 1 + TURNS, answered
    assert alone.count("append") == 2 + 4 * TURNS - 2 + 1 + TURNS, alone
    # ... or in its request's append
    assert taken.count("append") == 1 + 1 + 2 * (TURNS - 1) + 1, taken
    assert set(answered) <= {"append", "save_snapshot"}, answered
    assert [t for t, _ in answered_log] == [t for t, _ in alone_log] == [t for t, _ in taken_log]
    assert len({i for _, i in answered_log}) == len(answered_log)
    # each attempt right after its request, as it was appended with it
    for i, (t, _) in enumerate(taken_log):
        if t == LLM_ATTEMPTED:
            assert taken_log[i - 1][0] == LLM_REQUESTED
    coordinator = engine.bus.coordination()
    assert coordinator.client.keys(coordinator.key("exclusive", "*")) == []  # every lease let go


def test_a_request_recorded_with_its_attempt_but_sent_after_all_lets_the_lease_go_at_once(
    worker, pg_alias, redis_url, db_thread
):
    """A worker's bus says a model request, appended now, is delivered on the loop
    (``WorkerRuntime.takes``): its first attempt is recorded with it, under a lease
    taken before the append. Between the step and the publication the worker begins
    shutting down, so the request is sent after all: the lease goes at once
    (``not_delivered_here``), not after RESERVED_FOR, and the worker that takes the
    request finds the attempt's maker gone: it records the attempt abandoned (never
    sent) and makes the call, and the run ends as ever."""
    from aaa_django.algos import ToolLoop
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.runtime.event_types import LLM_ABANDONED
    from aaa_django.tools import ToolHandler, ToolRegistry
    from tests.runtime.test_store_calls import model, noop

    rt, engine, sent = worker
    coordinator = engine.bus.coordination()
    leases = coordinator.key("exclusive", "*")
    registry = ToolRegistry([noop])

    def worker_engine():
        built = beside(engine, db_thread.store(pg_alias), pg_alias)
        LLMHandler(FakeLLMClient(model)).attach(built)
        ToolHandler(registry).attach(built)
        return built

    mine, other = worker_engine(), worker_engine()
    rt.local_queues = frozenset(mine.bus.queues.values())
    held_as_sent: list[list] = []

    def local(engine, event, made_here=False):
        if event.type == LLM_REQUESTED:
            rt.draining = True  # (the worker is told to shut down, after the step)
        return rt.take(engine, event, made_here=made_here)

    def send(messages, ended, *, swallow=True):
        held_as_sent.append(coordinator.client.keys(leases))
        engine.bus._send(messages, ended, swallow=swallow)

    mine.bus.local = local
    mine.bus.local_takes = lambda e: rt.takes(mine, e)
    mine.bus._send = send
    run_id = f"run-sent-after-all-{uuid.uuid4().hex[:8]}"
    try:
        rt.run(mine.start(ToolLoop(registry, max_turns=11), {"task": "count"}, run_id=run_id))
        # the first step, on the loop, appended the request and sent it
        rt.run(_until(lambda: any(s["messages"] for s in sent)))
        first = rt.run(mine.store.read(run_id))
        assert [e.type for e in first[-2:]] == [LLM_REQUESTED, LLM_ATTEMPTED]  # recorded with it
        assert held_as_sent[-1] == [] and coordinator.client.keys(leases) == []  # let go before it was sent
        drive(rt, other, sent)  # the other worker takes it, and the rest of the run
        outcome = rt.run(other.outcome(run_id))
        log = rt.run(other.store.read(run_id))
    finally:
        rt.run(mine.close())
        rt.run(other.close())
    assert outcome.outcome == "success"
    request = first[-2]
    assert [(e.data["request_id"], e.data["attempt"]) for e in log if e.type == LLM_ABANDONED] == [(request.id, 1)]
    assert [e.data["attempt"] for e in log if e.type == LLM_ATTEMPTED and e.data["request_id"] == request.id] == [1, 2]


async def _until(check, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def test_a_re_drive_of_an_ended_run_leaves_nothing_of_it_in_the_worker(worker):
    rt, engine, sent = worker
    run_id = rt.run(_start(engine))
    drive(rt, engine, sent)
    events = rt.run(engine.store.read(run_id))
    assert events[-1].type == RUN_COMPLETED and engine.tail.cached(run_id, 1) is None

    # the sweeper's (or a redelivered message's) delivery of an event the run is past
    assert rt.run(deliver_event(engine, run_id, 1, events[0].id, redelivered=True)) == "delivered"
    assert engine.tail.cached(run_id, 1) is None  # read back, and dropped again
    assert len(engine.cache) == 0


async def _start(engine, model: str = "add_then_answer"):
    return (await engine.start(site.loop(model), {"task": "add 1 and 2"})).run_id


def test_a_worker_awaits_its_postgresql_store_on_the_loop(pg_alias, redis_url, settings):
    """On PostgreSQL with psycopg 3 the store a worker's messages name is the web
    process's PgEventStore: the worker's engine awaits it on the loop (its own
    connections, group commit), so a run's deliveries open no Django connection on
    the worker's db threads; the Django store keeps them (the other test)."""
    settings.AAA = {"REDIS_URL": redis_url, "WORKER_SETUP": "tests.scenarios.site.attach"}
    opened: list[str] = []

    def created(sender, connection, **kwargs):
        if connection.alias == pg_alias:
            opened.append(threading.current_thread().name)

    def run_one(store_class: str) -> list[str]:
        rt = WorkerRuntime()
        opened.clear()
        try:
            engine = build_worker_engine(["django", pg_alias, store_class], db=rt.db)
            sent: list[dict] = []
            engine.bus._send = lambda messages, ended, *, swallow=True: sent.append(
                {"messages": [m[1] for m in messages]}
            )
            run_id = rt.run(_start(engine))
            drive(rt, engine, sent)
            assert rt.run(engine.outcome(run_id)).outcome == "success"
            return [name for name in opened if name.startswith("aaa-worker-db")]
        finally:
            rt.close()

    connection_created.connect(created)
    try:
        awaited = run_one("aaa_django.store.postgres.PgEventStore")
        threaded = run_one("aaa_django.store.DjangoEventStore")
    finally:
        connection_created.disconnect(created)
    assert awaited == [] and threaded


def test_what_a_worker_s_postgresql_store_leaves_to_the_django_store_runs_on_its_db_threads(
    pg_alias, redis_url, settings
):
    """An append that is not the common case (more events than one statement takes) is
    the Django store's transactional one: in a worker it runs on the db threads (each
    with its connection, closed when found broken), not on the loop nor in asgiref's
    one thread."""
    from aaa_django.store.rows import INSERT_CHUNK

    settings.AAA = {"REDIS_URL": redis_url}
    rt = WorkerRuntime()
    try:
        engine = build_worker_engine(["django", pg_alias, "aaa_django.store.postgres.PgEventStore"], db=rt.db)
        store = engine.store.inner
        assert store.awaits
        threads: list[str] = []
        append_sync = store.append_sync

        def recorded(*args, **kwargs):
            threads.append(threading.current_thread().name)
            return append_sync(*args, **kwargs)

        store.append_sync = recorded
        stream = f"run-{uuid.uuid4().hex}"
        stored = rt.run(store.append([Event.new(stream, "test.e", {"i": i}) for i in range(INSERT_CHUNK + 1)]))
        assert [e.seq for e in stored] == list(range(1, INSERT_CHUNK + 2))
        assert len(threads) == 1 and threads[0].startswith("aaa-worker-db"), threads
    finally:
        rt.close()


def test_the_runtime_runs_sync_calls_on_its_thread():
    """``WorkerRuntime.call``: a plain sync function on the loop's thread (a profiler);
    Django's ORM refuses to run there (the loop runs)."""
    from django.core.exceptions import SynchronousOnlyOperation

    rt = WorkerRuntime()
    try:
        assert rt.call(threading.get_ident) == rt.thread.ident != threading.get_ident()
        assert rt.thread.daemon
        with pytest.raises(SynchronousOnlyOperation):
            rt.call(lambda: connections["default"].cursor())
    finally:
        rt.close()
    assert not rt.thread.is_alive()


def test_an_interrupted_wait_cancels_its_delivery():
    """A signal handler's exception (Celery's soft time limit, its shutdown) that cuts
    into the task thread's wait for a delivery stops the delivery on the loop too,
    and the loop stays usable."""
    import asyncio
    import signal

    rt = WorkerRuntime()
    started, cancelled = threading.Event(), threading.Event()

    class Limit(Exception):
        pass

    def limit(signum, frame):
        if not started.is_set():  # (the delivery is not under way yet: look again)
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            return
        raise Limit

    async def delivery():
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    previous = signal.signal(signal.SIGALRM, limit)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        with pytest.raises(Limit):
            rt.run(delivery())
        assert cancelled.wait(10)
        assert rt.run(asyncio.sleep(0, "next")) == "next"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        rt.close()


def test_an_interruption_while_the_delivery_is_handed_over_cancels_it_too():
    """The window of the test above, made certain: the interruption comes inside the
    hand-over of the coroutine to the loop, after the loop has started it (where
    ``asyncio.run_coroutine_threadsafe`` had scheduled it and not yet returned its
    future: the delivery went on, unowned, after its task had given up on it)."""
    import asyncio

    rt = WorkerRuntime()
    started, cancelled = threading.Event(), threading.Event()
    interrupted: list[bool] = []

    class Limit(Exception):
        pass

    async def delivery():
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    schedule = rt.loop.call_soon_threadsafe

    def handing_over(callback, *args, **kwargs):
        handle = schedule(callback, *args, **kwargs)
        if not interrupted and threading.current_thread() is not rt.thread:
            interrupted.append(True)
            assert started.wait(10)  # the loop runs the delivery now
            raise Limit  # (as a signal handler's exception would, here)
        return handle

    rt.loop.call_soon_threadsafe = handing_over
    try:
        with pytest.raises(Limit):
            rt.run(delivery())
        assert interrupted
        assert cancelled.wait(10)
        assert rt.run(asyncio.sleep(0, "next")) == "next"
    finally:
        rt.loop.call_soon_threadsafe = schedule
        rt.close()


def test_a_model_call_is_handed_off_its_task_returns_while_it_waits(worker, pg_alias, db_thread):
    """The delivery of a model request returns once the run's step is done and the call
    is under way on the loop (the task acknowledges its message); the call goes on,
    and its result is appended and sent when the model answers."""
    import asyncio

    from aaa_django.algos import ToolLoop
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.llm.fake import text
    from aaa_django.tools import ToolRegistry

    rt, engine, sent = worker
    gate: list[asyncio.Event] = []
    asked: list[str] = []

    async def model(request):
        asked.append("asked")
        gate.append(asyncio.Event())
        await gate[-1].wait()
        return text("done")

    mine = beside(engine, db_thread.store(pg_alias), pg_alias)
    LLMHandler(FakeLLMClient(model)).attach(mine)

    async def start():
        return (await mine.start(ToolLoop(ToolRegistry([]), max_turns=2), {"task": "wait"})).run_id

    run_id = rt.run(start())
    returned = []
    while not asked:
        messages = [m for s in sent for m in s["messages"]]
        if len(messages) == len(returned):  # a handed-off delivery's handlers still at work
            rt.run(asyncio.sleep(0.01))
            continue
        spec, stream, seq, event_id, *wire = messages[len(returned)]
        returned.append(rt.deliver(mine, stream, seq, event_id, wire=wire[0] if wire else None))
    types = [e.type for e in rt.run(mine.store.read(run_id))]
    assert types[-2:] == [LLM_REQUESTED, LLM_ATTEMPTED] and LLM_COMPLETED not in types
    assert returned[-1] == "handed off"  # the request's task returned, the call waits
    # the run's start was handed off too (its task returned once the step was done:
    # the validation went on on the loop), the input's validation was delivered
    assert returned[:-1] == ["handed off", "delivered"]
    assert len(rt.in_flight) == 1 and rt.handed_off == 2

    rt.loop.call_soon_threadsafe(gate[0].set)  # the model answers
    rt.run(rt.idle())
    assert not rt.in_flight
    events = rt.run(mine.store.read(run_id))
    assert [e.type for e in events] == [*types, LLM_COMPLETED]
    assert [m[3] for s in sent for m in s["messages"]][-1] == events[-1].id  # and sent on
    done = len(returned)
    while done < sum(len(s["messages"]) for s in sent):
        spec, stream, seq, event_id, *wire = [m for s in sent for m in s["messages"]][done]
        assert rt.deliver(mine, stream, seq, event_id, wire=wire[0] if wire else None) == "delivered"
        done += 1
    assert rt.run(mine.outcome(run_id)).outcome == "success"


@pytest.mark.parametrize("transient", [True, False], ids=["transient", "persistent"])
def test_a_handed_off_call_that_fails_is_retried_or_given_up_on_the_loop(worker, pg_alias, transient, db_thread):
    """Once a call is handed off its message is gone (acknowledged): a failure after
    it (here the store refusing the model's result) is the loop's to deal with, as
    the task deals with one before it. Transient: delivered again on the loop after
    the redelivery policy's delay (the model's handler here appends a result again
    itself no time: the failure is the delivery's), and the run goes on with the reply
    the handler kept, the model asked once; persistent: the run ends ``failed``
    naming the cause."""
    from aaa_django.algos import ToolLoop
    from aaa_django.events import StoreUnavailable
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.llm.fake import text
    from aaa_django.runtime.retry import Redelivery
    from aaa_django.tools import ToolRegistry

    rt, engine, sent = worker
    mine = beside(engine, db_thread.store(pg_alias), pg_alias)
    client = FakeLLMClient(lambda request: text("done"))
    LLMHandler(client, redelivery=Redelivery(retries=0)).attach(mine)
    refused: list[str] = []
    append = mine.store.append

    async def flaky(batch, **kw):
        if any(e.type == LLM_COMPLETED for e in batch) and (not transient or not refused):
            refused.append(batch[0].id)
            raise StoreUnavailable("the database went away", transient=transient)
        return await append(batch, **kw)

    mine.store.append = flaky

    async def start():
        return (await mine.start(ToolLoop(ToolRegistry([]), max_turns=2), {"task": "answer"})).run_id

    run_id = rt.run(start())
    done, returned = 0, []
    while done < sum(len(s["messages"]) for s in sent) or rt.in_flight:
        if done == sum(len(s["messages"]) for s in sent):
            rt.run(rt.idle())  # what the loop does after a hand-off sends more
            continue
        spec, stream, seq, event_id, *wire = [m for s in sent for m in s["messages"]][done]
        returned.append(rt.deliver(mine, stream, seq, event_id, wire=wire[0] if wire else None))
        done += 1

    outcome = rt.run(mine.outcome(run_id))
    types = [e.type for e in rt.run(mine.store.read(run_id))]
    assert "handed off" in returned and refused
    if transient:
        assert outcome.outcome == "success" and rt.retried == 1
        assert types.count(LLM_COMPLETED) == 1 and client.calls == 1  # the reply in hand, not a new one
    else:
        assert outcome.outcome == "failed" and rt.retried == 0 and len(refused) == 1
        assert outcome.value["error"] == "the event store failed: StoreUnavailable: the database went away"
        assert (outcome.value["event_type"], outcome.value["transient"]) == (LLM_REQUESTED, False)
        assert LLM_COMPLETED not in types and types[-1] == RUN_COMPLETED


def test_a_model_call_takes_its_run_s_lease_later_than_tool_work_but_before_the_run_could_look_stalled(settings):
    from datetime import datetime, timezone

    from aaa_django.celery.slow import SLOW_CALL, SLOW_DELIVERY, lease_after
    from aaa_django.runtime.event_types import TOOL_REQUESTED

    settings.AAA = {**getattr(settings, "AAA", {}), "STALL_AFTER": 60}
    written = datetime(2026, 1, 1, tzinfo=timezone.utc)
    at = written.timestamp()

    def event(type_: str) -> Event:
        return Event(id=uuid.uuid4().hex, stream="run-x", type=type_, data={}, time=written)

    # tool work: at once (its run's end is listened for, to cancel it)
    assert lease_after(event(TOOL_REQUESTED), at) == SLOW_DELIVERY
    assert lease_after(event(TOOL_REQUESTED), at + 59) == SLOW_DELIVERY
    # a model call that starts as its request is written: after SLOW_CALL
    assert lease_after(event(LLM_REQUESTED), at) == SLOW_CALL
    # one that starts late (a backlog): by a quarter of STALL_AFTER after the request
    assert lease_after(event(LLM_REQUESTED), at + 14.5) == pytest.approx(0.5)
    # past that: as soon as tool work would
    assert lease_after(event(LLM_REQUESTED), at + 40) == SLOW_DELIVERY
    settings.AAA = {**settings.AAA, "STALL_AFTER": 2}
    assert lease_after(event(LLM_REQUESTED), at) == pytest.approx(0.5)
    assert lease_after(event(LLM_REQUESTED), at + 1) == SLOW_DELIVERY
