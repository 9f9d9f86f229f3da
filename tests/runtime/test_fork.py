"""Fork: a new run from another run's first N events with a changed configuration.
What was decided and answered up to N stands (nothing is asked or run again), what
comes after is decided anew with the new configuration; redelivering the copied events
writes nothing (their ids are the ones the fork derives); forks of forks too."""

from __future__ import annotations

import json

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import registry
from aaa_django.runtime.event_types import (
    CHILD_COMPLETED,
    CHILD_REQUESTED,
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_COMPLETED,
    TOOL_REQUESTED,
)
from aaa_django.runtime.fork import FORKED_FROM, ForkError, fork, merge_patch
from aaa_django.runtime.replay import replay
from aaa_django.tools import ToolRegistry, tool
from tests.runtime import algos  # noqa: F401  (registers tests.parent)
from tests.runtime.helpers import arun, make_engine, of_type, types

CALLS = {"fetch": 0, "model": []}


@tool
def fetch(city: str) -> int:
    """The population of a city."""
    CALLS["fetch"] += 1
    return {"Lyon": 522_250}[city]


TOOLS = ToolRegistry([fetch])


def model(request):
    """Look Lyon up, then answer; the answer names the model that gave it."""
    CALLS["model"].append(request.model)
    if request.messages[-1].role != "tool":
        return tool_call("fetch", city="Lyon")
    return text(f"{request.model or 'default'}: 522,250")


@pytest.fixture(autouse=True)
def _calls():
    CALLS.update(fetch=0, model=[])


async def run_to_end(engine, algorithm, input, run_id):
    run = await engine.start(algorithm, input, run_id=run_id)
    await run.result(timeout=10)
    await engine.drain(5)
    return await engine.store.read(run_id)


def seq_of(log, type):
    return of_type(log, type)[0].seq


def test_a_fork_keeps_what_was_decided_and_decides_anew_after():
    async def scenario():
        async with make_engine(model, TOOLS) as engine:
            x = await run_to_end(engine, ToolLoop(TOOLS), {"task": "Lyon?"}, "run-x")
            at = seq_of(x, TOOL_COMPLETED)  # before the second model request
            before = (CALLS["fetch"], len(CALLS["model"]))
            y = await fork(engine, "run-x", at, config={**x[0].data["config"], "model": "better"}, owner="7")
            outcome = await y.result(timeout=10)
            await engine.drain(5)
            return x, at, before, outcome, await engine.store.read(y.run_id)

    x, at, (fetched, asked), outcome, y = arun(scenario())
    assert outcome.ok and outcome.value == {"text": "better: 522,250"}
    assert CALLS["fetch"] == fetched  # the tool result was copied, not fetched again
    assert CALLS["model"][asked:] == ["better"]  # one new model call, with the new model
    # The copy: the same events in the same order, under the fork's ids.
    assert types(y[:at]) == types(x[:at])
    assert [e.data for e in y[1:at] if e.type == TOOL_COMPLETED] == [
        e.data for e in x[1:at] if e.type == TOOL_COMPLETED
    ]
    assert not {e.id for e in y} & {e.id for e in x}
    origin = y[0].data[FORKED_FROM]
    assert (origin["run"], origin["seq"], origin["event"]) == ("run-x", at, x[at - 1].id)
    assert y[0].data["owner"] == "7" and y[0].data["config"]["model"] == "better"
    # Each request has exactly one result, and the causation links stay inside the fork.
    requests = [e.id for e in y if e.type in (LLM_REQUESTED, TOOL_REQUESTED)]
    results = [e.causation for e in y if e.type in (LLM_COMPLETED, TOOL_COMPLETED)]
    assert sorted(requests) == sorted(results)
    ids = {e.id for e in y}
    assert all(e.causation in ids for e in y[1:])


def test_delivering_a_forks_events_again_writes_nothing():
    async def scenario():
        async with make_engine(model, TOOLS) as engine:
            x = await run_to_end(engine, ToolLoop(TOOLS), {"task": "Lyon?"}, "run-x")
            y = await fork(engine, "run-x", seq_of(x, LLM_COMPLETED) + 1)
            await y.result(timeout=10)
            await engine.drain(5)
            log = await engine.store.read(y.run_id)
            calls = (CALLS["fetch"], len(CALLS["model"]))
            # The copied events delivered again, as a sweeper or a second worker would.
            for e in log:
                await engine.handle(e)
            await engine.drain(5)
            return log, calls, await engine.store.read(y.run_id)

    log, calls, again = arun(scenario())
    assert [e.id for e in again] == [e.id for e in log]
    assert (CALLS["fetch"], len(CALLS["model"])) == calls


def test_a_fork_of_a_fork_and_a_fork_replay_as_recorded():
    async def scenario():
        async with make_engine(model, TOOLS) as engine:
            x = await run_to_end(engine, ToolLoop(TOOLS), {"task": "Lyon?"}, "run-x")
            y = await fork(engine, "run-x", seq_of(x, TOOL_COMPLETED), new_run_id="run-y")
            await y.result(timeout=10)
            y_log = await engine.store.read("run-y")
            z = await fork(
                engine,
                "run-y",
                seq_of(y_log, LLM_COMPLETED),
                new_run_id="run-z",
                config=merge_patch(x[0].data["config"], {"model": "z"}),
            )
            await z.result(timeout=10)
            await engine.drain(5)
            return y_log, await engine.store.read("run-z"), z

    y, z, handle = arun(scenario())
    assert z[0].data[FORKED_FROM]["lineage"] == [y[0].data[FORKED_FROM]["lineage"][0], y[0].id]
    assert of_type(z, RUN_COMPLETED)[0].data["value"] == {"text": "z: 522,250"}
    for log in (y, z):
        r = arun(replay(log))
        assert r.same, r.explain()


def test_a_child_that_had_ended_stays_ended_and_an_open_one_starts_afresh():
    parent = registry.build(
        "tests.parent", {"child": {"algorithm": "aaa.algos.ToolLoop", "config": {"tools": TOOLS.specs()}}}
    )

    async def scenario():
        async with make_engine(model, TOOLS) as engine:
            x = await run_to_end(engine, parent, {"task": "Lyon?"}, "run-p")
            (x_child,) = [e.data["child"] for e in of_type(x, CHILD_REQUESTED)]
            ended = await fork(engine, "run-p", seq_of(x, CHILD_COMPLETED))
            open_ = await fork(engine, "run-p", seq_of(x, CHILD_REQUESTED))
            done = [await ended.result(timeout=10), await open_.result(timeout=10)]
            await engine.drain(5)
            return (x_child, done, await engine.store.read(ended.run_id), await engine.store.read(open_.run_id), engine)

    x_child, done, ended, open_, engine = arun(scenario())
    assert [o.outcome for o in done] == ["success", "success"]
    (kept,) = [e.data["child"] for e in of_type(ended, CHILD_REQUESTED)]
    assert kept != x_child  # the fork's own name for it...
    assert of_type(ended, CHILD_COMPLETED)[0].data["child"] == kept  # ...ended, as it was
    assert arun(engine.store.read(kept)) == []  # and never started again
    (fresh,) = [e.data["child"] for e in of_type(open_, CHILD_REQUESTED)]
    child_log = arun(engine.store.read(fresh))
    assert child_log[0].data["parent"] == open_[0].stream  # started afresh, under the fork
    assert of_type(open_, CHILD_COMPLETED)[0].data["child"] == fresh


@pytest.mark.parametrize(
    "at, config, why",
    [
        (0, None, "1 or more"),
        (99, None, "has"),
        ("last", None, "at or after the run's end"),
        (2, {"max_turns": 0}, "does not suit"),
    ],
)
def test_a_fork_that_cannot_be_made_is_refused_and_writes_nothing(at, config, why):
    async def scenario():
        async with make_engine(model, TOOLS) as engine:
            x = await run_to_end(engine, ToolLoop(TOOLS), {"task": "Lyon?"}, "run-x")
            streams = await engine.store.streams()
            with pytest.raises(ForkError, match=why):
                await fork(engine, "run-x", len(x) if at == "last" else at, config=config)
            with pytest.raises(ForkError, match="no run"):
                await fork(engine, "run-none", 1)
            return streams, await engine.store.streams()

    before, after = arun(scenario())
    assert before == after


def test_merge_patch_follows_rfc_7386():
    assert merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}, "f": [1]}) == {
        "a": 1,
        "b": {"d": 3, "e": 4},
        "f": [1],
    }
    assert merge_patch({"a": 1}, {"a": None}) == {}
    assert merge_patch({"a": 1}, [1]) == [1]


# -- on the site's stores: SQLite with file blobs, PostgreSQL with S3 blobs (moto) -----------


@pytest.fixture(params=[("default", "files"), ("postgres", "s3")], ids=["sqlite-files", "postgres-s3"])
def site_store(request, settings, tmp_path):
    from aaa_django.site.blobs import StorageBlobStore

    alias, kind = request.param
    if alias == "postgres":
        alias = request.getfixturevalue("pg_alias")
    options = {"location": str(tmp_path / "blobs")} if kind == "files" else request.getfixturevalue("s3_bucket")
    backend = "django.core.files.storage.FileSystemStorage" if kind == "files" else "storages.backends.s3.S3Storage"
    settings.STORAGES = {**settings.STORAGES, "fork_blobs": {"BACKEND": backend, "OPTIONS": options}}
    return alias, StorageBlobStore(alias="fork_blobs")


BIG = "x" * 3000


@tool
def document() -> str:
    """A long document (claim-checked)."""
    return BIG


def reader(request):
    if request.messages[-1].role != "tool":
        return tool_call("document")
    return text(f"{request.model or 'default'} read {len(request.messages[-1].content)} chars")


@pytest.mark.django_db(databases="__all__", transaction=True)  # the engine on PostgreSQL writes on its own connections
def test_a_fork_on_the_site_has_its_own_blobs_and_outlives_its_origin(site_store):
    from asgiref.sync import async_to_sync

    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.runtime import InProcessBus
    from aaa_django.site.engines import build_engine
    from aaa_django.tools import ToolHandler

    alias, blobs = site_store
    tools = ToolRegistry([document])

    async def scenario():
        async with build_engine(using=alias, bus=InProcessBus(), blobs=blobs, claim_threshold=1000) as engine:
            LLMHandler(FakeLLMClient(reader)).attach(engine)
            ToolHandler(tools).attach(engine)
            x = await run_to_end(engine, ToolLoop(tools), {"task": "Read it."}, "run-site-x")
            y = await fork(
                engine, "run-site-x", seq_of(x, TOOL_COMPLETED), config={**x[0].data["config"], "model": "m2"}
            )
            assert (await y.result(timeout=120)).value == {"text": "m2 read 3000 chars"}
            await engine.drain(30)
            await engine.erase("run-site-x")
            log = await engine.store.read(y.run_id)
            return y.run_id, log, [await engine.hydrate(e) for e in log]

    y, raw, hydrated = async_to_sync(scenario)()
    claimed = [e for e in raw if e.blobs]
    assert claimed and all(ref.namespace == y for e in claimed for ref in e.blobs)
    assert blobs.list("run-site-x") == [] and len(blobs.list(y)) >= len(claimed)
    assert BIG in json.dumps([e.data for e in hydrated])  # readable after its origin is gone
    from aaa_django.models import RunRecord

    row = RunRecord.objects.using(alias).get(pk=y)
    assert (row.forked_from, row.outcome) == ("run-site-x", "success")
