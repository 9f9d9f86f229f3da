"""A run's input may be larger than the claim threshold (16 KiB: one pasted document).

What routes, authorises and limits a run (algorithm, owner, budget, deadline, parent:
``meta.FOLDED``) stays in its ``aaa.run.started`` when the start is claim-checked; only the
input moves to the blob. Runs of 16,383 B, 16,385 B and 1 MB inputs succeed on the
memory, SQLite and PostgreSQL stores (the REST API: ``tests/api/test_large_inputs.py``;
the Celery bus: the ``input_*`` scenarios of ``tests/scenarios``), and nothing follows a run's completion.
"""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.data import InMemoryBlobStore, canonical_json, is_claimed
from aaa_django.events import FoldCache, InMemoryEventStore
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text
from aaa_django.runtime import Engine
from aaa_django.runtime.event_types import (
    INPUT_VALIDATED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
)
from aaa_django.store import DjangoEventStore
from aaa_django.tools import ToolRegistry

SIZES = [16_383, 16_385, 1_000_000]
LOOP = ToolLoop(ToolRegistry([]))
ROUTING = {"algorithm", "owner", "budget", "deadline", "parent"}


def task_of(size: int) -> str:
    """The task of an input whose JSON is ``size`` bytes."""
    return "x" * (size - len(canonical_json({"task": ""})))


def echo_size(request):
    return text(f"{len(request.messages[-1].content)} chars")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request):
    if request.param == "memory":
        return InMemoryEventStore()
    request.getfixturevalue("transactional_db")
    alias = {"sqlite": "default", "postgres": "postgres"}[request.param]
    if alias == "postgres":
        request.getfixturevalue("pg_alias")
    return DjangoEventStore(alias)


async def run_with(store, task: str, **start):
    engine = Engine(store=store, blobs=InMemoryBlobStore(), cache=FoldCache())
    LLMHandler(FakeLLMClient(echo_size)).attach(engine)
    async with engine:
        run = await engine.start(LOOP, {"task": task}, owner="7", **start)
        outcome = await run.result(timeout=30)
        await engine.drain(10)
        log = await engine.store.read(run.run_id)
        return outcome, log, await engine.meta(run.run_id), await engine.hydrate(log[0])


@pytest.mark.django_db(databases="__all__", transaction=True)
@pytest.mark.parametrize("size", SIZES)
def test_a_run_with_a_large_input_succeeds_and_keeps_its_routing_in_its_start(store, size):
    task = task_of(size)
    outcome, log, meta, started = asyncio.run(run_with(store, task, budget={"model_calls": 2}, deadline=120))

    assert outcome.outcome == "success" and outcome.value == {"text": f"{len(task)} chars"}
    assert [e.type for e in log] == [
        RUN_STARTED,
        INPUT_VALIDATED,
        LLM_REQUESTED,
        LLM_ATTEMPTED,
        LLM_COMPLETED,
        RUN_COMPLETED,
    ]
    stub = log[0].data
    assert is_claimed(stub) and "input" not in stub  # only the input moved to the blob
    assert {k: stub[k] for k in ROUTING} == {k: started.data[k] for k in ROUTING}
    assert stub["owner"] == "7" and stub["budget"] == {"model_calls": 2}
    assert started.data["input"] == {"task": task}
    assert (meta.algorithm, meta.owner, meta.budget.model_calls) == (LOOP.name, "7", 2)


@pytest.mark.parametrize("over", [0, 1])
def test_the_start_is_claim_checked_only_over_the_threshold(over):
    """The started event's own JSON at 16,384 bytes stays whole; at 16,385 it is
    claim-checked, and routes the run the same."""
    name, config = Engine().describe(LOOP)
    data = lambda task: {
        "algorithm": name,
        "config": config,
        "input": {"task": task},  # noqa: E731
        "budget": None,
        "deadline": None,
        "parent": None,
        "owner": "7",
    }
    task = "x" * (16_384 + over - len(canonical_json(data(""))))
    assert len(canonical_json(data(task))) == 16_384 + over

    outcome, log, meta, _ = asyncio.run(run_with(InMemoryEventStore(), task))

    assert is_claimed(log[0].data) == bool(over)
    assert outcome.value == {"text": f"{len(task)} chars"} and meta.owner == "7"
