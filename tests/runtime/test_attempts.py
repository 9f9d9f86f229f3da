"""Every model attempt is on the log before it is sent, and nothing is paid twice unseen
(issue 37): an attempt whose process died with it in flight is recorded abandoned and
counted at its estimate; a duplicate delivery while its maker is on it is neither; a
view of the run that is old is never decided from; a crash loop ends the run
``failed``; a run's end records the calls it cut off.

In one process, on the in-process bus: a process that dies is an engine closed without
draining (its deliveries cancelled), and the next one adopts the run from the log
(``Engine.resume``).
"""

from __future__ import annotations

import asyncio
import copy

import pytest

from aaa_django.algos import Algorithm, ToolLoop
from aaa_django.events import Event, FoldCache, InMemoryEventStore
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text
from aaa_django.llm.messages import user
from aaa_django.runtime import RUNMETA, Engine, InProcessBus
from aaa_django.runtime.event_types import (
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    attempt_id,
    result_event,
    result_id,
)
from aaa_django.runtime.holding import HoldsRuns
from aaa_django.tools import ToolHandler, ToolRegistry, tool

from .helpers import FAR_DEADLINE, arun, of_type, pass_deadline, types, until
from .scenarios import add, add_then_answer

RUN = "run-attempts"
ADD = ToolRegistry([add])


def engine_on(store, client, *, registry=ADD, bus=None, **options) -> Engine:
    engine = Engine(store=store, bus=bus if bus is not None else InProcessBus(), cache=FoldCache(), **options)
    LLMHandler(client).attach(engine)
    if registry is not None:
        ToolHandler(registry).attach(engine)
    return engine


def reads_whole(log: list[Event]) -> None:
    """Each model or tool request has exactly one result, before the run's end; each
    attempt has one outcome (a result naming it, an abandonment, or a later attempt
    of the same call)."""
    requests = [e.id for e in log if e.type in ("aaa.llm.requested", "aaa.tool.requested")]
    results = [
        e for e in log if e.type in ("aaa.llm.completed", "aaa.llm.failed", "aaa.tool.completed", "aaa.tool.failed")
    ]
    assert sorted(e.id for e in results) == sorted(result_id(r) for r in requests)
    end = [e.seq for e in log if e.type == "aaa.run.completed"]
    assert len(end) == 1 and end[0] == log[-1].seq and all(e.seq < end[0] for e in results)


def attempts_of(log: list[Event]) -> list[tuple[str, int]]:
    return [(e.data["request_id"], e.data["attempt"]) for e in of_type(log, LLM_ATTEMPTED)]


# -- the normal case ------------------------------------------------------------------------


def test_each_attempt_is_on_the_log_before_it_is_sent_and_the_result_names_it():
    store = InMemoryEventStore()
    seen: list[list[int]] = []  # at each call: the request's attempts on the log

    async def model(request):
        log = await store.read(request.run_id)
        seen.append(
            [e.data["attempt"] for e in of_type(log, LLM_ATTEMPTED) if e.data["request_id"] == request.request_id]
        )
        return add_then_answer(request)

    client = FakeLLMClient(model)

    async def main():
        async with engine_on(store, client) as engine:
            run = await engine.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await store.read(RUN)

    outcome, log = arun(main())
    assert outcome.ok
    assert seen == [[1], [1]] and client.calls == 2 == len(of_type(log, LLM_ATTEMPTED))
    for attempt, result in zip(of_type(log, LLM_ATTEMPTED), of_type(log, LLM_COMPLETED)):
        assert attempt.id == attempt_id(attempt.data["request_id"], 1) and attempt.seq < result.seq
        assert result.data["attempt"] == 1 and result.data["request_id"] == attempt.data["request_id"]
        assert attempt.data["model"] == "fake" and attempt.data["estimate"]["usage"]["output_tokens"] == 4096
    spend = RUNMETA.fold(log).spend
    assert (spend.attempts, spend.abandoned, spend.model_calls) == (2, 0, 2)
    reads_whole(log)


def test_an_attempts_estimate_is_the_prompt_and_the_replys_limit_priced():
    """The request's ``max_tokens`` is the reply's limit; the prompt is a token for four
    characters; the fake client's prices are per token."""

    class Ask(Algorithm):
        name = "tests.attempts.ask"

        async def step(self, ctx, event):
            if event.type == "aaa.input.validated":
                ctx.llm([user("x" * 40)], tag="ask", params={"max_tokens": 100})
            elif event.type == LLM_COMPLETED:
                ctx.complete("success", {"text": event.data["response"]["message"]["content"]})

    client = FakeLLMClient(lambda r: text("ok"), price_in=0.5, price_out=2.0)

    async def main():
        store = InMemoryEventStore()
        async with engine_on(store, client, registry=None) as engine:
            run = await engine.start(Ask(), {}, run_id=RUN)
            assert (await run.result(timeout=10)).ok
            await engine.drain(5)
            return await store.read(RUN)

    (attempt,) = of_type(arun(main()), LLM_ATTEMPTED)
    assert attempt.data["estimate"] == {
        "usage": {"input_tokens": 10, "output_tokens": 100},
        "cost": 10 * 0.5 + 100 * 2.0,
    }


# -- a process that dies with a call in flight -----------------------------------------------


class Gate:
    """A model whose first ``hold`` calls never answer (the process making them dies);
    counts every call it receives, as a provider would."""

    def __init__(self, hold: int) -> None:
        self.hold = hold
        self.calls = 0
        self.called = asyncio.Event()

    async def __call__(self, request):
        self.calls += 1
        self.called.set()
        if self.calls <= self.hold:
            await asyncio.Event().wait()  # until the process dies
        return add_then_answer(request)


async def die_with_calls_in_flight(model: Gate, crashes: int, **options):
    """Start a ToolLoop; ``crashes`` times: once a call is in flight, close the engine
    without draining (the process is gone) and adopt the run in a new one. Returns the
    outcome and the log."""
    store = InMemoryEventStore()
    client = FakeLLMClient(model)
    engine = engine_on(store, client, **options)
    await engine.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
    for _ in range(crashes):
        await asyncio.wait_for(model.called.wait(), 5)
        model.called.clear()
        await engine.close(drain=False)
        engine = engine_on(store, client, **options)
        assert await engine.resume() == [RUN]
    async with engine:
        outcome = await engine.run(RUN).result(timeout=10)
        await engine.drain(5)
    return outcome, await store.read(RUN)


def test_an_attempt_its_process_died_with_is_abandoned_counted_at_its_estimate_and_made_again():
    model = Gate(hold=1)
    outcome, log = arun(die_with_calls_in_flight(model, crashes=1))
    assert outcome.ok and outcome.value == {"text": "1 + 2 = 3"}
    first = of_type(log, "aaa.llm.requested")[0].id
    assert attempts_of(log) == [(first, 1), (first, 2), (of_type(log, "aaa.llm.requested")[1].id, 1)]
    assert model.calls == len(of_type(log, LLM_ATTEMPTED)) == 3  # the provider's calls, all on the log
    (abandoned,) = of_type(log, "aaa.llm.abandoned")
    estimate = of_type(log, LLM_ATTEMPTED)[0].data["estimate"]
    assert abandoned.data["attempt"] == 1 and abandoned.data["request_id"] == first
    assert (abandoned.data["usage"], abandoned.data["cost"]) == (estimate["usage"], estimate["cost"])
    assert abandoned.causation == attempt_id(first, 1)
    assert types(log).index("aaa.llm.abandoned") < [e.id for e in log].index(attempt_id(first, 2))
    assert of_type(log, LLM_COMPLETED)[0].data["attempt"] == 2
    meta = RUNMETA.fold(log)
    replies = of_type(log, LLM_COMPLETED)
    assert (meta.spend.attempts, meta.spend.abandoned) == (3, 1)
    assert meta.spend.cost == pytest.approx(estimate["cost"] + sum(r.data["cost"] for r in replies))
    assert meta.spend.tokens_out == estimate["usage"]["output_tokens"] + sum(
        r.data["usage"]["output_tokens"] for r in replies
    )
    reads_whole(log)


@pytest.mark.parametrize("limit", [3, 2])
def test_a_crash_loop_ends_the_run_failed_after_the_limit_of_abandoned_attempts(limit):
    model = Gate(hold=10)  # every attempt's process dies
    outcome, log = arun(die_with_calls_in_flight(model, crashes=limit, max_abandoned=limit))
    (request,) = of_type(log, "aaa.llm.requested")
    assert outcome.outcome == "failed"
    assert outcome.value["reason"] == "abandoned_attempts" and outcome.value["request_id"] == request.id
    assert (outcome.value["abandoned"], outcome.value["limit"]) == (limit, limit)
    # every attempt the provider received is on the log, and abandoned; none more was made
    assert model.calls == limit
    assert attempts_of(log) == [(request.id, n) for n in range(1, limit + 1)]
    assert [e.data["attempt"] for e in of_type(log, "aaa.llm.abandoned")] == list(range(1, limit + 1))
    # the run's end records the call: failed, reason "abandoned", before aaa.run.completed
    assert types(log)[-2:] == ["aaa.llm.failed", "aaa.run.completed"]
    cut = of_type(log, "aaa.llm.failed")[0]
    assert cut.data["reason"] == "abandoned" and cut.data["cut_off"] is True and "usage" not in cut.data
    # the spend counts each abandoned attempt at its estimate
    meta = RUNMETA.fold(log)
    estimates = [e.data["estimate"] for e in of_type(log, LLM_ATTEMPTED)]
    assert (meta.spend.attempts, meta.spend.abandoned, meta.spend.model_calls) == (limit, limit, 1)
    assert meta.spend.cost == pytest.approx(sum(e["cost"] for e in estimates)) and meta.spend.cost > 0
    assert meta.spend.tokens_out == sum(e["usage"]["output_tokens"] for e in estimates)
    reads_whole(log)


def test_a_redelivery_while_the_call_is_in_flight_here_is_neither_abandoned_nor_sent():
    """At-least-once brings the request again (a re-drive, a duplicate message) while
    this process is making its attempt: nothing is written, nothing sent."""
    model = Gate(hold=0)
    release = asyncio.Event()

    async def slow(request):
        model.calls += 1
        model.called.set()
        await release.wait()
        return add_then_answer(request)

    async def main():
        store = InMemoryEventStore()
        async with engine_on(store, FakeLLMClient(slow)) as engine:
            run = await engine.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
            await asyncio.wait_for(model.called.wait(), 5)
            (request,) = of_type(await store.read(RUN), "aaa.llm.requested")
            await engine.bus.publish([request])  # delivered again
            assert await engine.resume() == [RUN]  # and re-driven whole
            await until(lambda: _idle_but_the_call(engine), timeout=5)
            release.set()
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await store.read(RUN)

    outcome, log = arun(main())
    assert outcome.ok
    assert model.calls == 2 == len(of_type(log, LLM_ATTEMPTED))  # one a request
    assert of_type(log, "aaa.llm.abandoned") == []
    reads_whole(log)


async def _idle_but_the_call(engine) -> bool:
    # every delivery but the one waiting on the model has ended
    return engine.bus.pending <= 1


# -- decisions read the run's head from the database, not this process's view ----------------


async def _stale_view(answered_elsewhere: bool, attempt_held: bool):
    """Engine A holds the run's log up to its model request (no model handler yet);
    meanwhile "another process" writes to the store directly, behind A's back: the
    request's attempt 1, and its result or not. Then A's handler gets the request again,
    its view of the run (its tail) not knowing of those writes."""
    store = InMemoryEventStore()
    a = Engine(store=store, cache=FoldCache())
    ToolHandler(ADD).attach(a)
    await a.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
    await a.drain(5)
    (request,) = of_type(await store.read(RUN), "aaa.llm.requested")
    attempt = Event(
        id=attempt_id(request.id, 1),
        stream=RUN,
        type=LLM_ATTEMPTED,
        causation=request.id,
        data={
            "request_id": request.id,
            "attempt": 1,
            "model": "fake",
            "estimate": {"usage": {"input_tokens": 5, "output_tokens": 50}, "cost": 0.5},
        },
    )
    if attempt_held:
        await a.append([attempt])  # A's view has the attempt...
    else:
        await store.append([attempt])
    if answered_elsewhere:  # ... the store has its result too
        await store.append(
            [
                result_event(
                    request,
                    LLM_COMPLETED,
                    {
                        "request_id": request.id,
                        "tag": request.data["tag"],
                        "thread": "main",
                        "attempt": 1,
                        "response": {"message": {"role": "assistant", "content": "3"}, "finish_reason": "stop"},
                        "usage": {"input_tokens": 5, "output_tokens": 1},
                        "cost": 0.01,
                    },
                )
            ]
        )
    client = FakeLLMClient(add_then_answer)
    LLMHandler(client).attach(a)
    assert a.tail.holds(request)  # (so its delivery takes A's view as current)
    await a.handle(request)
    await a.close(drain=False)
    return client, await store.read(RUN)


@pytest.mark.parametrize("attempt_held", [False, True], ids=["view-without-attempt", "view-with-attempt"])
def test_a_request_answered_elsewhere_is_not_sent_again_whatever_this_process_saw(attempt_held):
    client, log = arun(_stale_view(answered_elsewhere=True, attempt_held=attempt_held))
    assert client.calls == 0
    assert len(of_type(log, LLM_ATTEMPTED)) == 1 and of_type(log, "aaa.llm.abandoned") == []
    assert len(of_type(log, LLM_COMPLETED)) == 1


def test_an_attempt_found_without_its_result_and_without_its_maker_is_abandoned_once():
    client, log = arun(_stale_view(answered_elsewhere=False, attempt_held=False))
    assert client.calls == 1
    assert [e.data["attempt"] for e in of_type(log, LLM_ATTEMPTED)] == [1, 2]
    (abandoned,) = of_type(log, "aaa.llm.abandoned")
    assert (abandoned.data["usage"], abandoned.data["cost"]) == ({"input_tokens": 5, "output_tokens": 50}, 0.5)


class NotHeld(InProcessBus):
    """A bus that says this process does not hold the run (another took it over)."""

    def holds(self, run_id: str) -> bool:
        return False


def test_a_process_that_does_not_hold_the_run_makes_no_attempt():
    assert isinstance(NotHeld(), HoldsRuns) and not isinstance(InProcessBus(), HoldsRuns)
    client = FakeLLMClient(add_then_answer)

    async def main():
        store = InMemoryEventStore()
        async with engine_on(store, client, bus=NotHeld()) as engine:
            run = await engine.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
            await engine.drain(5)
            await run.cancel("nobody holds it")
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await store.read(RUN)

    outcome, log = arun(main())
    assert client.calls == 0 and of_type(log, LLM_ATTEMPTED) == []
    assert outcome.outcome == "cancelled"
    (cut,) = of_type(log, "aaa.llm.failed")  # no attempt in flight: nothing estimated
    assert cut.data["reason"] == "cancelled" and "cost" not in cut.data
    reads_whole(log)


# -- a reply in hand is never asked for again --------------------------------------------------


class FailingResults(InMemoryEventStore):
    """A store whose appends of a model's result fail ``times`` times (a full disk, a
    database restarting): an outage, transient."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times
        self.refused = 0

    async def append(self, events, **kwargs):
        if self.refused < self.times and any(e.type == LLM_COMPLETED for e in events):
            from aaa_django.events import StoreUnavailable

            self.refused += 1
            raise StoreUnavailable("the disk is full", transient=True)
        return await super().append(events, **kwargs)


@pytest.mark.parametrize("times", [1, 5], ids=["retried-by-the-handler", "kept-for-the-redelivery"])
def test_a_reply_whose_append_fails_is_appended_again_never_asked_again(times):
    """Once: the handler appends the reply again. Five times (past the handler's own
    two retries): the request's delivery fails, the bus delivers it again, and the
    handler appends the reply it kept."""
    from aaa_django.runtime.retry import Backoff, Redelivery

    client = FakeLLMClient(add_then_answer)
    fast = Redelivery(retries=2, backoff=Backoff(initial=0.001, max=0.002))
    store = FailingResults(times)

    async def main():
        engine = Engine(store=store, bus=InProcessBus(redelivery=fast), cache=FoldCache())
        LLMHandler(client, redelivery=fast).attach(engine)
        ToolHandler(ADD).attach(engine)
        async with engine:
            run = await engine.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await store.read(RUN)

    outcome, log = arun(main())
    assert store.refused == times
    assert outcome.ok and outcome.value == {"text": "1 + 2 = 3"}
    assert client.calls == 2 == len(of_type(log, LLM_ATTEMPTED))  # one call a request
    assert of_type(log, "aaa.llm.abandoned") == []
    reads_whole(log)


# -- the end of a run records what it cut off --------------------------------------------------


@tool(name="slow_lookup")
async def slow_lookup() -> str:
    """Takes its time."""
    await asyncio.sleep(30)
    return "late"


class AskAndLookUp(Algorithm):
    """Asks the model and calls a slow tool at once; ends when both answered."""

    name = "tests.attempts.ask_and_look_up"

    async def step(self, ctx, event):
        if event.type == "aaa.input.validated":
            ctx.llm([user("think")], tag="think")
            ctx.tool("slow_lookup", {}, call_id="c1")


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_a_run_ended_with_a_model_and_a_tool_call_in_flight_records_both_before_its_end(how):
    thinking = asyncio.Event()

    async def model(request):
        thinking.set()
        await asyncio.sleep(30)
        return text("too late")

    async def main():
        store = InMemoryEventStore()
        async with engine_on(store, FakeLLMClient(model), registry=ToolRegistry([slow_lookup])) as engine:
            run = await engine.start(
                AskAndLookUp(), {}, run_id=RUN, deadline=FAR_DEADLINE if how == "deadline" else None
            )
            await asyncio.wait_for(thinking.wait(), 5)
            if how == "cancel":
                await run.cancel("enough", by="tester")
            else:
                await pass_deadline(engine, RUN)
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await store.read(RUN)

    outcome, log = arun(main())
    reason = "cancelled" if how == "cancel" else "timeout"
    assert outcome.outcome == reason
    llm, tool_result = of_type(log, "aaa.llm.failed"), of_type(log, "aaa.tool.failed")
    assert types(log)[-3:] == ["aaa.llm.failed", "aaa.tool.failed", "aaa.run.completed"]
    (llm,), (tool_result,) = llm, tool_result
    (attempt,) = of_type(log, LLM_ATTEMPTED)
    assert llm.data == {
        "request_id": attempt.data["request_id"],
        "tag": "think",
        "thread": "main",
        "reason": reason,
        "cut_off": True,
        "attempt": 1,
        "estimated": True,
        **attempt.data["estimate"],
        "error": f"the run ended ({reason}) before the model call had a result",
    }
    assert (tool_result.data["reason"], tool_result.data["call_id"], tool_result.data["cut_off"]) == (
        reason,
        "c1",
        True,
    )
    # the call in flight counts at its estimate: it was sent, its reply is not on the log
    assert RUNMETA.fold(log).spend.cost == attempt.data["estimate"]["cost"]
    reads_whole(log)


@pytest.mark.parametrize("name", ["crash", "cancel"])
def test_runmeta_folded_in_any_split_equals_the_whole_fold_with_attempts(name):
    if name == "crash":
        _, log = arun(die_with_calls_in_flight(Gate(hold=10), crashes=3))
    else:
        _, log = arun(_cancelled_mid_call())
    assert of_type(log, LLM_ATTEMPTED)
    whole = RUNMETA.dump(RUNMETA.fold(log))
    for cut in range(len(log) + 1):
        head = RUNMETA.fold(log[:cut])
        resumed = RUNMETA.parse(RUNMETA.dump(head))  # as a snapshot would
        assert RUNMETA.dump(RUNMETA.fold(log[cut:], resumed)) == whole
        assert RUNMETA.dump(RUNMETA.fold(log[cut:], copy.deepcopy(head))) == whole


async def _cancelled_mid_call():
    model = Gate(hold=10)
    store = InMemoryEventStore()
    async with engine_on(store, FakeLLMClient(model)) as engine:
        run = await engine.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
        await asyncio.wait_for(model.called.wait(), 5)
        await run.cancel("stop")
        outcome = await run.result(timeout=10)
        await engine.drain(5)
    return outcome, await store.read(RUN)


# -- ... on the real database, refusing the reply's insert as a full disk does -----------------

#: a trigger that refuses the first ``n`` inserts of a model's result as PostgreSQL does
#: when its disk is full (SQLSTATE 53100), whoever inserts; a sequence counts them (a
#: refused insert's transaction is rolled back, its ``nextval`` is not)
REFUSE_REPLIES = """
CREATE SEQUENCE aaa_test_refusals;
CREATE FUNCTION aaa_test_refuse_replies() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.type = 'aaa.llm.completed' AND nextval('aaa_test_refusals') <= {n} THEN
    RAISE EXCEPTION 'could not extend file "base/16384/16402": No space left on device'
      USING ERRCODE = 'disk_full';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER aaa_test_refuse_replies BEFORE INSERT ON aaa_event
  FOR EACH ROW EXECUTE FUNCTION aaa_test_refuse_replies();
"""
ALLOW_REPLIES = """
DROP TRIGGER IF EXISTS aaa_test_refuse_replies ON aaa_event;
DROP FUNCTION IF EXISTS aaa_test_refuse_replies();
DROP SEQUENCE IF EXISTS aaa_test_refusals;
"""


@pytest.mark.django_db(databases=["postgres"], transaction=True)
@pytest.mark.parametrize("times", [1, 5], ids=["retried-by-the-handler", "kept-for-the-redelivery"])
def test_on_postgresql_a_full_disk_under_a_reply_costs_no_second_call(pg_alias, times):
    from django.db import connections

    from aaa_django.runtime.retry import Backoff, Redelivery
    from aaa_django.store.postgres import site_store

    fast = Redelivery(retries=2, backoff=Backoff(initial=0.001, max=0.002))
    client = FakeLLMClient(add_then_answer)
    with connections[pg_alias].cursor() as cur:
        cur.execute(REFUSE_REPLIES.format(n=times))
    try:

        async def main():
            store = site_store(pg_alias)
            engine = Engine(store=store, bus=InProcessBus(redelivery=fast), cache=FoldCache())
            LLMHandler(client, redelivery=fast).attach(engine)
            ToolHandler(ADD).attach(engine)
            async with engine:
                run = await engine.start(ToolLoop(ADD), {"task": "add 1 and 2"})
                outcome = await run.result(timeout=20)
                await engine.drain(5)
                return outcome, await store.read(run.run_id)

        outcome, log = arun(main(), timeout=60)
        with connections[pg_alias].cursor() as cur:
            cur.execute("SELECT last_value FROM aaa_test_refusals")
            (refusals,) = cur.fetchone()
    finally:
        with connections[pg_alias].cursor() as cur:
            cur.execute(ALLOW_REPLIES)
    assert refusals > times  # the database did refuse the reply that many times, then took it
    assert outcome.ok and outcome.value == {"text": "1 + 2 = 3"}
    assert client.calls == 2 == len(of_type(log, LLM_ATTEMPTED))  # one call a request, none again
    assert of_type(log, "aaa.llm.abandoned") == []
    reads_whole(log)


# -- two processes: a lease per call, unless the bus says who holds the run ------------------


class Leasing(InProcessBus):
    """The in-process bus with the cluster's exclusive leases (``ExclusiveLeases``, as the
    Celery bus offers them), shared by the "processes" given the same ``held`` dict; it
    counts the leases asked for."""

    def __init__(self, held: dict) -> None:
        super().__init__()
        self.held = held
        self.asked = 0

    def exclusive(self, name: str):
        self.asked += 1
        lock = self.held.setdefault(name, asyncio.Lock())
        return lock


class LeasingHere(Leasing):
    """:class:`Leasing` that says a request appended here is delivered here
    (``DeliversHere``, as a Celery worker's bus does for the queues it takes): the
    model handler records a call's first attempt with its request, holding the
    attempt's lease from before the append. ``away``: requests appended here are
    delivered elsewhere after all (the worker began shutting down: sent); ``tells``:
    the bus then says so (``not_delivered_here``, as the Celery bus does)."""

    def __init__(self, held: dict, *, away: bool = False, tells: bool = False) -> None:
        super().__init__(held)
        self.away = away
        self.tells = tells

    def delivers_here(self, event: Event) -> bool:
        return True

    async def publish(self, events) -> None:
        from aaa_django.runtime.appends import not_delivered_here

        events = list(events)
        away = {e.id for e in events if self.away and e.type == "aaa.llm.requested"}
        if self.tells:
            await not_delivered_here(self.engine, [e for e in events if e.causation in away])
        await super().publish([e for e in events if e.id not in away])


@pytest.mark.parametrize("here", [False, True], ids=["attempt-appended-alone", "attempt-with-request"])
@pytest.mark.parametrize("maker", ["lives", "dies"])
def test_a_delivery_in_another_process_waits_for_the_calls_maker_then_decides(maker, here):
    """Two processes (two engines over one log, their leases shared): the second gets
    the request while the first makes its call. It waits for the first's lease; if the
    first answers, nothing more is made; if the first dies with its call, the second
    records it abandoned and calls again. The same where the first recorded its first
    attempt with the request (its bus says the request is delivered there): the lease
    was held from before the request's append."""
    from aaa_django.runtime.bus import DeliversHere, ExclusiveLeases

    held: dict = {}
    release = asyncio.Event()
    calls = {"first": 0, "second": 0}

    def model(who: str):
        async def answer(request):
            calls[who] += 1
            if who == "first":
                await release.wait()
            return add_then_answer(request)

        return answer

    async def main():
        store = InMemoryEventStore()
        batches: list[list[str]] = []
        append = store.append

        async def recording(events, **kw):
            batches.append([e.type for e in events])
            return await append(events, **kw)

        store.append = recording  # type: ignore[method-assign]
        one = engine_on(store, FakeLLMClient(model("first")), bus=LeasingHere(held) if here else Leasing(held))
        two = engine_on(store, FakeLLMClient(model("second")), bus=Leasing(held))
        assert isinstance(one.bus, ExclusiveLeases) and isinstance(one.bus, DeliversHere) == here
        await one.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
        await until(_called(calls), timeout=5)
        (request,) = of_type(await store.read(RUN), "aaa.llm.requested")
        # (recorded with the request: in its append, right after it)
        assert any(b[-2:] == ["aaa.llm.requested", LLM_ATTEMPTED] for b in batches) == here
        waiting = asyncio.ensure_future(two.handle(request))  # the request again, elsewhere
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done() and calls["second"] == 0  # it waits for the maker's lease
        if maker == "lives":
            release.set()  # the first's model answers
            outcome = await one.run(RUN).result(timeout=10)
            await asyncio.wait_for(waiting, 5)
            await one.drain(5)
        else:
            await one.close(drain=False)  # the first process dies: its lease goes with it
            await asyncio.wait_for(waiting, 5)
            outcome = await two.run(RUN).result(timeout=10)
            await two.drain(5)
        log = await store.read(RUN)
        for engine in (one, two):
            await engine.close(drain=False)
        return outcome, log, one.bus.asked + two.bus.asked

    outcome, log, leases = arun(main())
    first_request = of_type(log, "aaa.llm.requested")[0].id
    assert outcome.ok and leases >= 3  # a lease a delivery of a model request
    if maker == "dies":
        assert [e.data["attempt"] for e in of_type(log, "aaa.llm.abandoned")] == [1]
        assert attempts_of(log)[:2] == [(first_request, 1), (first_request, 2)]
        assert calls == {"first": 1, "second": 2}  # its attempt 2, then the second request
    else:
        assert of_type(log, "aaa.llm.abandoned") == [] and attempts_of(log)[0] == (first_request, 1)
        assert calls == {"first": 2, "second": 0}
    assert calls["first"] + calls["second"] == len(of_type(log, LLM_ATTEMPTED))
    reads_whole(log)


@pytest.mark.parametrize("told", [True, False], ids=["bus-tells", "bus-silent"])
def test_a_first_attempt_recorded_with_its_request_that_no_delivery_here_takes_is_let_go(monkeypatch, told):
    """A request appended with its first attempt, by a process whose bus said it would
    deliver it, but was delivered elsewhere after all: the attempt's lease is let go,
    at once when the bus says it sent the request (``not_delivered_here``: RESERVED_FOR
    is left at its 30 s), else after RESERVED_FOR, and the other process, which waited
    for it, records the attempt abandoned (never sent: counted at its estimate, on the
    log) and makes the call."""
    from aaa_django.llm import handler as llm_handler

    if not told:
        monkeypatch.setattr(llm_handler, "RESERVED_FOR", 0.3)
    held: dict = {}
    calls = {"first": 0, "second": 0}

    def model(who: str):
        async def answer(request):
            calls[who] += 1
            return add_then_answer(request)

        return answer

    async def main():
        store = InMemoryEventStore()
        one = engine_on(store, FakeLLMClient(model("first")), bus=LeasingHere(held, away=True, tells=told))
        two = engine_on(store, FakeLLMClient(model("second")), bus=Leasing(held))
        await one.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)

        async def requested() -> bool:
            return bool(of_type(await store.read(RUN), "aaa.llm.requested"))

        await until(requested, timeout=5)
        (request,) = of_type(await store.read(RUN), "aaa.llm.requested")
        lease = held[attempt_id(request.id, 1)]
        if told:  # let go by the first, which will not deliver it, long before RESERVED_FOR

            async def let_go() -> bool:
                return not lease.locked()

            await until(let_go, timeout=5)
        else:
            assert lease.locked()  # held by the first, which will not deliver it
        await asyncio.wait_for(two.handle(request), 5)  # waits, then decides
        assert not lease.locked()
        outcome = await two.run(RUN).result(timeout=10)
        await two.drain(5)
        log = await store.read(RUN)
        for engine in (one, two):
            await engine.close(drain=False)
        return outcome, log

    outcome, log = arun(main())
    first_request = of_type(log, "aaa.llm.requested")[0].id
    assert outcome.ok
    assert [e.data["attempt"] for e in of_type(log, "aaa.llm.abandoned")] == [1]
    assert attempts_of(log)[:2] == [(first_request, 1), (first_request, 2)]
    assert calls["first"] == 0 and calls["second"] == len(of_type(log, LLM_ATTEMPTED)) - 1
    reads_whole(log)


def test_a_first_attempt_whose_append_is_refused_lets_its_lease_go_at_once():
    """The step's append of a request with its first attempt is refused (the log moved
    on: another process's step appended first): the attempt's lease, taken before it,
    goes at once, not after RESERVED_FOR, so a delivery of the request elsewhere that
    appended it alone records the attempt itself without waiting. Appended again, it is
    recorded again, under a lease taken anew."""
    from dataclasses import replace

    from aaa_django.events import ConcurrencyError

    held: dict = {}

    async def main():
        store = InMemoryEventStore()
        one = engine_on(store, FakeLLMClient(add_then_answer), bus=LeasingHere(held, away=True))
        await one.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)

        async def requested() -> bool:
            return bool(of_type(await store.read(RUN), "aaa.llm.requested"))

        await until(requested, timeout=5)
        log = await store.read(RUN)
        (request,) = of_type(log, "aaa.llm.requested")
        again = replace(request, id="another-request", seq=None)
        lease = held.setdefault(attempt_id(again.id, 1), asyncio.Lock())
        with pytest.raises(ConcurrencyError):
            await one.append_at([again], head=log[-1].seq - 1)  # the log moved on
        refused_then = lease.locked()
        stored = await one.append_at([again], head=log[-1].seq)
        held_now = lease.locked()
        await one.close(drain=False)
        return refused_then, [e.type for e in stored], held_now

    refused_then, stored, held_now = arun(main())
    assert refused_then is False  # let go with the refused append
    assert stored == ["aaa.llm.requested", LLM_ATTEMPTED] and held_now  # recorded with it, held for its delivery


def _called(calls: dict):
    async def check() -> bool:
        return calls["first"] == 1

    return check


def ended_process() -> str:
    """The holder id of a process of this machine that has ended."""
    import subprocess
    import sys

    from aaa_django.runtime.holding import holder_id

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    name, host, namespace, _, started, rand = holder_id("llm").split("|")
    return "|".join([name, host, namespace, proc.stdout.strip(), started, rand])


def test_an_attempt_whose_makers_process_has_ended_is_not_waited_for():
    """Its maker died on this machine (its pid is gone): its lease, which only lapses
    later, is not waited for; the attempt is abandoned and made again."""
    held: dict = {}
    client = FakeLLMClient(add_then_answer)

    async def main():
        store = InMemoryEventStore()
        engine = Engine(store=store, bus=Leasing(held), cache=FoldCache())
        ToolHandler(ADD).attach(engine)
        await engine.start(ToolLoop(ADD), {"task": "add 1 and 2"}, run_id=RUN)
        await engine.drain(5)
        (request,) = of_type(await store.read(RUN), "aaa.llm.requested")
        dead = ended_process()
        lease = held.setdefault(attempt_id(request.id, 1), asyncio.Lock())
        await lease.acquire()  # the dead maker's lease: never let go (it lapses only after its TTL)
        await store.append(
            [
                Event(
                    id=attempt_id(request.id, 1),
                    stream=RUN,
                    type=LLM_ATTEMPTED,
                    causation=request.id,
                    data={
                        "request_id": request.id,
                        "attempt": 1,
                        "model": "fake",
                        "by": dead,
                        "estimate": {"usage": {"input_tokens": 5, "output_tokens": 50}, "cost": 0.5},
                    },
                )
            ]
        )
        LLMHandler(client).attach(engine)
        await engine.resume([RUN])
        outcome = await engine.run(RUN).result(timeout=10)
        await engine.drain(5)
        log = await store.read(RUN)
        await engine.close(drain=False)
        return outcome, log, dead

    outcome, log, dead = arun(main())
    assert outcome.ok and client.calls == 2  # attempt 2 of the first request, then the second request
    (abandoned,) = of_type(log, "aaa.llm.abandoned")
    assert (abandoned.data["attempt"], abandoned.data["maker"]) == (1, dead)
    reads_whole(log)
