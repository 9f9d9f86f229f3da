"""Claim-checked events keep what ``RUNMETA`` folds (``meta.FOLDED``): the engine and
the run index fold it over raw events, never fetching a blob, so a big input, big tool
arguments or a big reply never hide a run's budget, deadline, owner or approval gate.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import async_to_sync

from aaa_django.algos import ToolLoop
from aaa_django.data import InMemoryBlobStore, is_claimed
from aaa_django.events import InMemoryEventStore
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import RUNMETA
from aaa_django.runtime.event_types import APPROVAL_REQUESTED, RUN_COMPLETED
from aaa_django.tools import ToolRegistry, tool

from . import scenarios
from .helpers import make_engine

#: the scenarios whose every event but the completion is claim-checked below: each
#: limit, outcome and gate that RUNMETA decides
CLAIMED = [
    "success",
    "budget_tokens",
    "budget_cost",
    "budget_model_calls",
    "budget_tool_calls",
    "invalid_input",
    "cancelled",
    "approval_granted",
    "approval_denied",
    "approval_expired",
    "child_run",
    "cascade_cancel",
]


@pytest.mark.parametrize("name", CLAIMED)
def test_every_outcome_holds_with_every_payload_claim_checked(name, monkeypatch):
    def claiming(*args, **kwargs):
        return make_engine(*args, blobs=InMemoryBlobStore(), claim_threshold=0, **kwargs)

    monkeypatch.setattr(scenarios, "make_engine", claiming)
    scenario, outcome, types = scenarios.EXPECTED[name]

    result = asyncio.run(asyncio.wait_for(scenario(False), 30))

    assert result.outcome.outcome == outcome
    assert [e.type for e in result.log] == types
    assert all(is_claimed(e.data) for e in result.log if e.type != RUN_COMPLETED and e.data)

    # RUNMETA folded over the stubs is RUNMETA folded over the payloads, run by run
    async def hydrated(events):
        return [await result.engine.hydrate(e) for e in events]

    for run_id in {e.stream for e in result.log}:
        raw = [e for e in result.log if e.stream == run_id]
        assert RUNMETA.fold(raw) == RUNMETA.fold(asyncio.run(hydrated(raw)))


# -- the defect: an approval request whose arguments were claim-checked ------------------------


@tool(requires_approval=True)
def publish(text: str) -> str:
    """Publishes a text (a person approves it first)."""
    return f"published {len(text)} characters"


REPORT = "lorem ipsum " * 500  # 6,000 characters: over the 1 KiB threshold below


def publish_then_answer(request):
    done = [m for m in request.messages if m.role == "tool"]
    return text(done[0].content) if done else tool_call("publish", text=REPORT)


def _memory(request):
    return InMemoryEventStore()


def _sqlite(request):
    from aaa_django.store import DjangoEventStore

    return DjangoEventStore("default")


def _postgres(request):
    from aaa_django.store import DjangoEventStore

    return DjangoEventStore(request.getfixturevalue("pg_alias"))


def _redis(request):
    from aaa_django.store.redis import RedisEventStore
    from tests.store.test_eventstore_redis import _delete_prefix

    store = RedisEventStore(request.getfixturevalue("redis_url"), prefix=f"test-{uuid.uuid4().hex[:12]}")
    request.addfinalizer(lambda: _delete_prefix(store))
    return store


DB = pytest.mark.django_db(databases="__all__", transaction=True)
STORES = [
    pytest.param(_memory, id="memory"),
    pytest.param(_sqlite, id="sqlite", marks=DB),
    pytest.param(_postgres, id="postgres", marks=[DB, pytest.mark.postgres]),
    pytest.param(_redis, id="redis", marks=pytest.mark.redis),
]


@pytest.mark.parametrize("make_store", STORES)
def test_an_approval_request_with_claim_checked_arguments_is_still_a_gate(make_store, request):
    store = make_store(request)
    registry = ToolRegistry([publish])

    async def main():
        async with make_engine(
            publish_then_answer, registry, store=store, blobs=InMemoryBlobStore(), claim_threshold=1024
        ) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "publish the report"})
            while not (meta := await run.meta()).approvals:
                assert not meta.completed and not engine.errors, engine.errors
                await asyncio.sleep(0.01)
            (gate,) = meta.approvals.values()
            await engine.approve(run.run_id, next(iter(meta.approvals)), by="alice")
            return gate, await run.result(timeout=10), await store.read(run.run_id)

    gate, outcome, log = async_to_sync(main)()
    (asked,) = [e for e in log if e.type == APPROVAL_REQUESTED]
    assert is_claimed(asked.data) and asked.blobs  # the arguments went to the blob store...
    assert (gate.name, gate.tool_request_id) == ("publish", asked.data["tool_request_id"])  # ...the gate stayed
    assert (outcome.outcome, outcome.value) == ("success", {"text": "published 6000 characters"})


def test_a_big_invalid_input_is_rejected_with_its_errors_quoting_it_briefly():
    big = {"task": "", "notes": "x" * 20_000}

    async def main():
        async with make_engine(publish_then_answer, blobs=InMemoryBlobStore(), claim_threshold=1024) as engine:
            run = await engine.start(ToolLoop(), big)
            return await run.result(timeout=10), await run.events()

    outcome, log = asyncio.run(main())
    started, rejected = log[0], log[1]
    assert is_claimed(started.data) and not is_claimed(rejected.data)  # the errors stay in the event
    assert outcome.outcome == "invalid_input"
    assert [(e["loc"], e["type"]) for e in outcome.value["errors"]] == [
        (["task"], "string_too_short"),
        (["notes"], "extra_forbidden"),
    ]
    assert outcome.value["errors"][1]["input"] == '"' + "x" * 199 + "..."
