"""The engine's public surface: claims, hydration, erase, registry, approvals, ReAct."""

from __future__ import annotations

import asyncio
import copy

import pytest

from aaa_django.algos import LOOP, ReAct, ToolLoop
from aaa_django.data import FileBlobStore, InMemoryBlobStore
from aaa_django.events import Event, FoldCache, InMemoryEventStore
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import RUNMETA, Engine, Outcome, UnknownAlgorithmError, registry
from aaa_django.tools import ToolRegistry, tool

from . import algos
from .helpers import arun, make_engine, of_type, tool_messages, types, until
from .scenarios import EXPECTED, add, add_then_answer


@tool
def big(n: int) -> str:
    """Returns n characters."""
    return "y" * n


def big_then_echo(request):
    if tool_messages(request) == 0:
        return tool_call("big", n=5000)
    return text("z" * 5000)  # a big final answer too


async def run_big(engine: Engine, run_id: str):
    run = await engine.start(ToolLoop(ToolRegistry([big])), {"task": "big"}, run_id=run_id)
    outcome = await run.result(timeout=10)
    await engine.drain(5)
    return outcome


@pytest.mark.parametrize("blob_kind", ["memory", "file"])
def test_claims_hot_fields_and_completion_never_claimed(blob_kind, tmp_path):
    blobs = InMemoryBlobStore() if blob_kind == "memory" else FileBlobStore(tmp_path)

    async def scenario():
        async with make_engine(big_then_echo, ToolRegistry([big]), blobs=blobs, claim_threshold=1000) as engine:
            outcome = await run_big(engine, "run-a")
            raw = await engine.store.read("run-a")
            full = [await engine.hydrate(e) for e in raw]
            return outcome, raw, full

    outcome, raw, full = arun(scenario())
    assert outcome.value == {"text": "z" * 5000}
    (tool_done,) = of_type(raw, "aaa.tool.completed")
    assert tool_done.data == {"$claim": True, "call_id": tool_done.data["call_id"], "name": "big"}
    (llm_done,) = [e for e in of_type(raw, "aaa.llm.completed") if "$claim" in e.data]
    assert set(llm_done.data) == {"$claim", "usage", "cost", "tag", "request_id"}  # spend without a fetch
    (completed,) = of_type(raw, "aaa.run.completed")
    assert "$claim" not in completed.data and not completed.blobs
    assert all("$claim" not in e.data for e in full)
    assert of_type(full, "aaa.tool.completed")[0].data["result"] == "y" * 5000


def test_small_payloads_make_no_call_to_the_blob_store(tmp_path):
    # A file store's calls run on a thread (it is synchronous): a small payload, which
    # stays in the event, must not pay that hop. Only the big ones are claimed.
    blobs = FileBlobStore(tmp_path)
    calls: list[str] = []

    async def scenario():
        async with make_engine(big_then_echo, ToolRegistry([big]), blobs=blobs, claim_threshold=1000) as engine:
            blob_call = engine._blob_call

            async def counted(fn, *args, **kwargs):
                calls.append(fn.__name__)
                return await blob_call(fn, *args, **kwargs)

            engine._blob_call = counted
            await run_big(engine, "run-a")
            return await engine.store.read("run-a")

    raw = arun(scenario())
    claimed = [e for e in raw if e.blobs]
    assert calls.count("put_claim") == len(claimed) and 0 < len(claimed) < len(raw)


def test_blobs_are_per_run_and_erase_removes_only_that_runs():
    blobs = InMemoryBlobStore()

    async def scenario():
        async with make_engine(big_then_echo, ToolRegistry([big]), blobs=blobs, claim_threshold=1000) as engine:
            await run_big(engine, "run-a")
            await run_big(engine, "run-b")
            a_blobs, b_blobs = len(blobs.list("run-a")), len(blobs.list("run-b"))
            await RUNMETA.load(engine.store, "run-a", cache=engine.cache)
            erased = await engine.erase("run-a")
            return (
                a_blobs,
                b_blobs,
                erased,
                await engine.store.read("run-a"),
                await engine.store.load_snapshot("run-a", RUNMETA.name, RUNMETA.version),
                [k for k in engine.cache._entries if k[1] == "run-a"],
                await engine.outcome("run-b"),
            )

    a_blobs, b_blobs, erased, left, snap, holder, b_outcome = arun(scenario())
    assert a_blobs == b_blobs > 0  # identical payloads, two runs: two sets of blobs
    assert erased > 0 and left == [] and snap is None and holder == []
    assert blobs.list("run-a") == [] and len(blobs.list("run-b")) == b_blobs
    assert b_outcome.ok


def test_hydrate_is_a_noop_for_ordinary_events():
    e = Event.new("s", "aaa.x.happened", {"a": 1})
    assert arun(Engine(cache=FoldCache()).hydrate(e)) is e


def test_cancel_and_approve_after_the_end_change_nothing():
    async def scenario():
        async with make_engine(add_then_answer, ToolRegistry([add])) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "x"}, run_id="run-x")
            await run.result(timeout=10)
            await engine.drain(5)
            before = await engine.store.read("run-x")
            assert await run.cancel("too late") is False
            assert await engine.approve("run-x", "no-such-request") is False
            await engine.drain(5)
            return before, await engine.store.read("run-x")

    before, after = arun(scenario())
    assert [e.id for e in after] == [e.id for e in before]


def test_an_approval_that_expires_at_once_counts_as_denied():
    async def scenario():
        @tool(requires_approval=True, approval_expires=0.0)
        def nuke() -> str:
            """Dangerous."""
            return "boom"

        reg = ToolRegistry([nuke])
        model = lambda r: tool_call("nuke") if tool_messages(r) == 0 else text("ok")  # noqa: E731
        async with make_engine(model, reg) as engine:
            run = await engine.start(ToolLoop(reg), {"task": "x"}, run_id="run-e")
            await run.result(timeout=10)
            await engine.drain(5)
            return await engine.store.read("run-e")

    log = arun(scenario())
    assert "aaa.approval.expired" in types(log)
    assert of_type(log, "aaa.tool.failed")[0].data["reason"] == "expired"


def test_approving_after_the_expiry_records_expiry_even_without_a_timer():
    """Another process (no timer armed) answers too late: expiry wins, not the grant."""
    seen = {"ran": 0}

    @tool(requires_approval=True, approval_expires=1.0)
    def nuke() -> str:
        """Dangerous."""
        seen["ran"] += 1
        return "boom"

    reg = ToolRegistry([nuke])
    model = lambda r: tool_call("nuke") if tool_messages(r) == 0 else text("ok")  # noqa: E731

    async def scenario():
        async with make_engine(model, reg) as engine:
            run = await engine.start(ToolLoop(reg), {"task": "x"}, run_id="run-late")
            await until(lambda: _has_approval(engine, "run-late"))
            # The engine holds the expiry's timer from the append that stored the
            # request (test_a_due_time_is_held_from_the_moment_it_is_stored...): once the
            # request is visible the timer is there, and nothing arms it again later.
            engine._timers.disarm("run-late")  # as if this process never armed the timer
            (rid,) = (await run.meta()).approvals  # taken well before the expiry
            await asyncio.sleep(1.1)
            assert await engine.approve("run-late", rid, by="slowpoke") is True
            await run.result(timeout=5)
            await engine.drain(5)
            return await engine.store.read("run-late")

    log = arun(scenario())
    assert "aaa.approval.expired" in types(log) and "aaa.approval.granted" not in types(log)
    assert seen["ran"] == 0


def test_a_due_time_is_held_from_the_moment_it_is_stored_until_the_run_ends():
    """The engine's timers follow the log as the run index's due times do: armed by the
    append that stores a deadline or an expiry (not by its later delivery, which left
    a moment when the log had the due time and the engine no timer), moved to the
    earliest, and dropped by the append that ends the run."""

    async def scenario():
        async with make_engine(lambda r: text("ok")) as engine:
            seen = {}
            run = await engine.start("tests.reader", {}, deadline=600, run_id="run-due")
            seen["started"] = engine.timers()  # nothing delivered yet: no await since the append
            deadline = (await run.meta()).deadline
            approval = Event(
                id="appr-1",
                stream="run-due",
                type="aaa.approval.requested",
                data={"tool_request_id": "t-1", "tool_request_seq": 1, "expires_at": deadline - 300},
            )
            await engine.append([approval])
            seen["approval"] = engine.timers()
            await engine.cancel("run-due", reason="enough")
            await run.result(timeout=5)
            seen["ended"] = engine.timers()
            await engine.drain(5)
            return deadline, seen

    deadline, seen = arun(scenario())
    assert seen == {"started": {"run-due": deadline}, "approval": {"run-due": deadline - 300}, "ended": {}}


def test_algorithms_are_rebuilt_from_the_started_event():
    loop = ToolLoop(ToolRegistry([add]), max_turns=3, system="s")
    rebuilt = registry.build(loop.name, loop.config())
    assert type(rebuilt) is ToolLoop and rebuilt.config() == loop.config()
    assert registry.get("tests.fanout") is algos.FanOut
    with pytest.raises(UnknownAlgorithmError):
        registry.get("nope.nothing")


def test_a_name_cannot_be_taken_twice():
    with pytest.raises(ValueError, match="taken"):
        registry.register(type("Other", (), {"name": "aaa.algos.ToolLoop"}))


def test_starting_an_unknown_algorithm_raises():
    with pytest.raises(UnknownAlgorithmError):
        arun(Engine(cache=FoldCache()).start("nope.nothing", {}))


def test_a_run_of_an_algorithm_this_process_does_not_know_fails():
    async def scenario():
        async with make_engine() as engine:
            await engine.append(
                [
                    Event(
                        id="s1",
                        stream="run-u",
                        type="aaa.run.started",
                        data={"algorithm": "elsewhere.only", "input": {}},
                    )
                ]
            )
            return await engine.run("run-u").result(timeout=5)

    outcome = arun(scenario())
    assert outcome.outcome == "failed" and "elsewhere.only" in outcome.value["error"]


def test_another_engine_adopts_a_run_waiting_for_approval():
    store = InMemoryEventStore()

    @tool(requires_approval=True)
    def deploy() -> str:
        """Deploys."""
        return "deployed"

    reg = ToolRegistry([deploy])
    model = lambda r: tool_call("deploy") if tool_messages(r) == 0 else text("shipped")  # noqa: E731

    async def first():
        async with make_engine(model, reg, store=store) as engine:
            run = await engine.start(ToolLoop(reg), {"task": "x"}, run_id="run-ad")
            await until(lambda: _has_approval(engine, "run-ad"))

    async def second():
        async with make_engine(model, reg, store=store) as engine:
            assert await engine.resume() == ["run-ad"]
            (rid,) = (await engine.meta("run-ad")).approvals
            assert await engine.approve("run-ad", rid, by="ops")
            return await engine.run("run-ad").result(timeout=5)

    arun(first())
    assert arun(second()).value == {"text": "shipped"}


async def _has_approval(engine, run_id):
    return bool((await engine.meta(run_id)).approvals)


def test_react_runs_tools_from_text():
    def model(request):
        last = request.messages[-1].content
        if last.startswith("Observation:"):
            return text(f"Thought: I know.\nFinal Answer: {last.split(': ', 1)[1]}")
        return text('Thought: add them.\nAction: add\nAction Input: {"a": 2, "b": 3}')

    async def scenario():
        async with make_engine(model, ToolRegistry([add])) as engine:
            run = await engine.start(ReAct(ToolRegistry([add])), {"task": "2+3"}, run_id="run-r")
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await engine.store.read("run-r")

    outcome, log = arun(scenario())
    assert outcome.value == {"text": "5"}
    assert types(log) == [
        "aaa.run.started",
        "aaa.input.validated",
        "aaa.llm.requested",
        "aaa.llm.attempted",
        "aaa.llm.completed",
        "aaa.tool.requested",
        "aaa.tool.completed",
        "aaa.llm.requested",
        "aaa.llm.attempted",
        "aaa.llm.completed",
        "aaa.run.completed",
    ]
    assert "Action Input" in of_type(log, "aaa.llm.requested")[0].data["messages"][0]["content"]


@pytest.mark.parametrize("projection", [RUNMETA, LOOP], ids=["RUNMETA", "LOOP"])
@pytest.mark.parametrize("name", ["success", "approval_denied", "budget_tool_calls", "pool"])
def test_projection_folded_in_any_split_equals_the_whole_fold(projection, name):
    log = arun(EXPECTED[name][0](False)).log
    whole = projection.dump(projection.fold(log))
    for cut in range(len(log) + 1):
        head = projection.fold(log[:cut])
        resumed = projection.parse(projection.dump(head))  # as a snapshot would
        assert projection.dump(projection.fold(log[cut:], resumed)) == whole
        assert projection.dump(projection.fold(log[cut:], copy.deepcopy(head))) == whole


def test_runmeta_tracks_spend_and_status():
    log = arun(EXPECTED["budget_tool_calls"][0](False)).log
    meta = RUNMETA.fold(log)
    assert meta.completed and meta.outcome == "budget_exceeded"
    assert meta.spend.model_calls == 2 and meta.spend.tool_calls == 1  # the 2nd tool call refused
    assert meta.spend.tokens_in > 0 and meta.spend.cost > 0


def test_child_key_defaults_to_a_hash_of_what_is_started():
    from .scenarios import CHILD

    async def scenario():
        async with make_engine(add_then_answer, ToolRegistry([add])) as engine:
            run = await engine.start(algos.Parent(child=CHILD, key=None), {"task": "add"}, run_id="run-p")
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await engine.store.read("run-p")

    outcome, log = arun(scenario())
    assert outcome.value == {"child": {"text": "1 + 2 = 3"}}
    (req,) = of_type(log, "aaa.child.requested")
    assert req.data["key"].startswith("aaa.algos.ToolLoop:")
    assert arun(scenario())[1][2].data["child"] == req.data["child"]  # deterministic


def test_outcome_value_object():
    assert Outcome("success", 1).ok and not Outcome("failed").ok
    with pytest.raises(ValueError):
        Outcome("great")


def test_tool_schema_from_hints_and_docstring():
    spec = add.spec()
    assert spec == {
        "name": "add",
        "description": "Adds two numbers.",
        "parameters": {
            "additionalProperties": False,
            "properties": {
                "a": {"description": "the first number", "type": "integer"},
                "b": {"description": "the second number", "type": "integer"},
            },
            "required": ["a", "b"],
            "type": "object",
        },
    }


def test_invalid_tool_arguments_are_a_failed_event():
    def model(request):
        return tool_call("add", a="not a number") if tool_messages(request) == 0 else text("ok")

    async def scenario():
        async with make_engine(model, ToolRegistry([add])) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "x"}, run_id="run-i")
            await run.result(timeout=10)
            await engine.drain(5)
            return await engine.store.read("run-i")

    (failed,) = of_type(arun(scenario()), "aaa.tool.failed")
    assert failed.data["reason"] == "invalid_arguments"
    assert {tuple(e["loc"]) for e in failed.data["errors"]} == {("a",), ("b",)}


def test_an_algorithm_emitting_non_json_fails_its_run():
    async def scenario():
        async with make_engine() as engine:
            run = await engine.start("tests.bad_output", {}, run_id="run-bad")
            return await run.result(timeout=5)

    outcome = arun(scenario())
    assert outcome.outcome == "failed" and "JSON" in outcome.value["error"]


def test_a_store_outage_inside_ctx_project_propagates():
    from aaa_django.runtime import StoreUnavailable

    class Broken:
        cache_key = "broken"

        async def read(self, stream, **kw):
            raise ConnectionError("database went away")

    from aaa_django.runtime.view import HydratedView

    async def same(event):
        return event

    view = HydratedView(Broken(), same, unavailable=True)  # the engine's view
    with pytest.raises(StoreUnavailable):
        arun(LOOP.load(view, "run-x"))


def test_a_projection_read_from_its_snapshot_through_the_engine_folds_full_payloads():
    """The engine's view reads a snapshot and the log after it at once, and the events
    come back hydrated (their claim-checked payloads restored), as from ``read``."""
    from aaa_django.events import Projection, Snapshot

    payloads = Projection(
        list, lambda s, e: [*s, e.data["payload"]], name="test.payloads", state_type=list[str], every=1_000
    )
    engine = Engine(InMemoryEventStore(), blobs=InMemoryBlobStore(), claim_threshold=0)

    async def main():
        stored = await engine.append([Event.new("notes", "acme.note.made", {"payload": f"p{i}"}) for i in range(5)])
        assert "payload" not in stored[0].data  # claim-checked: a stub in the log
        await engine.store.save_snapshot(Snapshot("notes", "test.payloads", 1, 2, stored[1].id, '["p0","p1"]'))
        return await payloads.load_info(engine.view, "notes")

    info = arun(main())
    assert (info.source, info.folded) == ("snapshot", 3)
    assert info.state == ["p0", "p1", "p2", "p3", "p4"]


def test_an_algorithm_is_not_stepped_for_the_events_it_ignores(monkeypatch):
    """ToolLoop ignores its own requests, as every built-in does (it decides again on
    their results): the engine steps it for every other event of the run, and the run
    ends the same."""
    from .scenarios import add, add_then_answer

    stepped: list[str] = []
    step = ToolLoop.step

    async def counting(self, ctx, event):
        stepped.append(event.type)
        await step(self, ctx, event)

    monkeypatch.setattr(ToolLoop, "step", counting)

    async def main():
        async with make_engine(add_then_answer, ToolRegistry([add])) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "add 1 and 2"})
            outcome = await run.result(timeout=10)
            return outcome, await run.events()

    outcome, events = arun(main())
    assert outcome.outcome == "success" and outcome.value == {"text": "1 + 2 = 3"}
    assert {"aaa.llm.requested", "aaa.tool.requested"} <= ToolLoop.ignores
    # (nor for a model call's attempt records: the engine's bookkeeping, never an algorithm's)
    assert stepped == [
        e.type
        for e in events
        if e.type not in ToolLoop.ignores
        and e.type not in ("aaa.run.started", "aaa.run.completed", "aaa.llm.attempted")
    ]
    assert "aaa.llm.requested" not in stepped and "aaa.llm.completed" in stepped


def test_the_bus_is_told_whether_what_it_publishes_is_committed():
    """A store's result inside a caller's transaction (``EventList.committed`` False)
    reaches the bus as such (the Celery bus enqueues it at the commit); any other
    result is committed (the Celery bus sends it at once)."""
    from aaa_django.events import EventList, InMemoryEventStore
    from aaa_django.runtime import InProcessBus

    published: dict[str, set[bool]] = {}

    class Recording(InProcessBus):
        async def publish(self, events):
            name = type(self.engine.store.inner).__name__
            published.setdefault(name, set()).add(isinstance(events, EventList) and events.committed)
            await super().publish(events)

    class InATransaction(InMemoryEventStore):
        async def append(self, events, **kwargs):
            stored = EventList(await super().append(events, **kwargs))
            stored.committed = False
            return stored

    async def main():
        for store in (InMemoryEventStore(), InATransaction()):
            async with Engine(store=store, bus=Recording(), cache=FoldCache(), validate=False) as engine:
                await engine.append([Event.new("run-c", "aaa.run.started", {"algorithm": "x", "input": {}})])

    arun(main())
    assert published == {"InMemoryEventStore": {True}, "InATransaction": {False}}
