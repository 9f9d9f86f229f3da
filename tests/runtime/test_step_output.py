"""A step's output is checked once (by the store, which checks every event it is
given), and the algorithm's own bad output still ends its run ``failed`` with the
check's error, whatever else is true of the step: over budget, past its own
completion, on an engine that claim-checks payloads."""

from __future__ import annotations

import pytest

from aaa_django.algos.base import Algorithm
from aaa_django.data import InMemoryBlobStore
from aaa_django.events import Event, InvalidEventError, check_event
from aaa_django.events import store as store_module
from aaa_django.runtime import steps as steps_module

from .helpers import arun, make_engine

#: the check's error for the bad event below
try:
    check_event(Event(id="x", stream="s", type="tests.thing.happened", data={"when": object()}))
except InvalidEventError as exc:
    ERROR = f"InvalidEventError: {exc}".split(" at 0x")[0]


class Emits(Algorithm):
    """On its start: two model requests, or a completion, and perhaps a bad event."""

    name = "tests.step_output.emits"

    async def step(self, ctx, event):
        if event.type != "aaa.input.validated":
            return
        mode = ctx.raw_input["mode"]
        if mode in ("good", "over budget"):
            ctx.llm([{"role": "user", "content": "a"}], key=1)
            ctx.llm([{"role": "user", "content": "b"}], key=2)
        if mode == "past the end":
            ctx.complete("success", {"done": True})
        if mode != "good":
            ctx.emit("tests.thing.happened", {"when": object()}, key="x")
        if mode == "good":
            ctx.complete("success", {"done": True})


def run(mode: str, **engine_kwargs):
    async def scenario():
        async with make_engine(**engine_kwargs) as engine:
            budget = {"model_calls": 1} if mode == "over budget" else None
            handle = await engine.start(Emits(), {"mode": mode}, budget=budget, run_id=f"run-{mode}")
            outcome = await handle.result(timeout=5)
            await engine.drain(5)
            return outcome, await engine.store.read(handle.run_id)

    return arun(scenario())


@pytest.mark.parametrize("mode", ["bad", "over budget", "past the end"])
@pytest.mark.parametrize("blobs", [None, "memory"])
def test_bad_output_fails_the_run_with_the_checks_error(mode, blobs):
    outcome, log = run(mode, blobs=InMemoryBlobStore() if blobs else None, claim_threshold=10)
    assert outcome.outcome == "failed"
    assert outcome.value["error"].split(" at 0x")[0] == ERROR
    assert "check_event" in outcome.value["traceback"]
    assert [e.type for e in log][-1] == "aaa.run.completed"
    assert not [e for e in log if e.type in ("tests.thing.happened", "aaa.llm.requested")]


def test_good_output_is_checked_once_by_the_store(monkeypatch):
    checked: list[str] = []

    def counting(e):
        checked.append(e.id)
        return check_event(e)

    monkeypatch.setattr(store_module, "check_event", counting)
    monkeypatch.setattr(steps_module, "check_event", counting)
    outcome, log = run("good")
    assert outcome.outcome == "success"
    assert sorted(checked) == sorted(e.id for e in log)  # each stored event once
