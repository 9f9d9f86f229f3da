"""Runs resume by themselves, with the site's handlers: the web process's engine host
and ``manage.py aaa_sweep`` adopt a run whose holder is gone and finish it with the
model client and the tools the settings name (``attach_site_handlers``), as the
workers do. (The example site killed and started again: tests/field/test_adoption.py.)"""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import time

import pytest
from django.core.management import call_command

from aaa_django.algos import ToolLoop
from aaa_django.llm import FakeLLMClient
from aaa_django.llm.fake import text, tool_calls
from aaa_django.models import RunRecord
from aaa_django.runtime import Engine, InProcessBus
from aaa_django.site.holding import holder_id
from aaa_django.site.host import EngineHost
from aaa_django.store import site_store
from aaa_django.store.leases import RunLeases
from aaa_django.tools import ToolRegistry, tool

pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)


@tool(inline=True)
def weigh(item: str) -> str:
    """Weighs an item.

    Args:
        item: what to weigh.
    """
    return f"{item}: 3 kg"


def scripted(request):
    results = [m for m in request.messages if m.role == "tool"]
    return text(f"it weighs {results[0].content}") if results else tool_calls(("weigh", {"item": "a box"}))


def model() -> FakeLLMClient:
    """``AAA["LLM_CLIENT"]`` here: the scripted model."""
    return FakeLLMClient(scripted)


SITE = {
    "LLM_CLIENT": "tests.site.test_recovery.model",
    "TOOLS": ["tests.site.test_recovery.weigh"],
    "API_RATE": None,
    "ADOPT": True,
}


def stranded(alias: str, holder: str | None = None) -> str:
    """A run whose start is in the log and nothing after it (its process died before it
    delivered anything), held by ``holder`` (a lease far from lapsing) or nobody."""

    async def start() -> str:
        bus = InProcessBus()
        bus.closed = True  # delivers nothing: the process is gone
        async with Engine(store=site_store(alias), bus=bus) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([weigh])), {"task": "weigh a box"})
            return run.run_id

    run_id = asyncio.run(start())
    if holder is not None:
        leases = RunLeases(alias)
        try:
            assert leases.claim(holder, [run_id], 3600) == {run_id}
        finally:
            leases.close()
    return run_id


def ended_holder() -> str:
    """The holder id of a process of this machine that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    with open(f"/proc/{child.pid}/stat") as f:
        started = f.read().rsplit(")", 1)[-1].split()[19]
    child.communicate(b"")
    parts = holder_id("web").split("|")
    parts[3], parts[4] = str(child.pid), started
    return "|".join(parts)


def outcome(alias: str, run_id: str) -> tuple[str | None, dict]:
    async def read():
        async with Engine(store=site_store(alias)) as engine:
            done = await engine.outcome(run_id)
            return (done.outcome, done.value) if done is not None else (None, {})

    return asyncio.run(read())


def test_aaa_sweep_finishes_a_stranded_run_with_the_sites_model_and_tools(db_alias, settings):
    settings.AAA = {**settings.AAA, **SITE}
    run_id = stranded(db_alias)
    out = io.StringIO()
    call_command("aaa_sweep", "--stall-after", "0", "--database", db_alias, "--wait", "60", stdout=out)

    assert run_id in out.getvalue() and "re-drove 1" in out.getvalue()
    assert outcome(db_alias, run_id) == ("success", {"text": "it weighs a box: 3 kg"})


def test_aaa_sweep_adopts_at_once_the_runs_of_a_process_that_has_ended(db_alias, settings):
    settings.AAA = {**settings.AAA, **SITE}
    run_id = stranded(db_alias, holder=ended_holder())
    out = io.StringIO()
    call_command("aaa_sweep", "--database", db_alias, "--wait", "60", stdout=out)  # STALL_AFTER: 60 s

    assert "1 adopted from a holder that was gone" in out.getvalue()
    assert outcome(db_alias, run_id) == ("success", {"text": "it weighs a box: 3 kg"})
    assert RunRecord.objects.using(db_alias).get(pk=run_id).adoptions == 1


def test_the_engine_host_adopts_the_runs_of_a_process_that_has_ended(settings):
    settings.AAA = {**settings.AAA, **SITE}
    run_id = stranded("default", holder=ended_holder())
    EngineHost.reset()
    try:
        host = EngineHost.get()
        end = time.monotonic() + 60
        while outcome("default", run_id)[0] is None:
            assert time.monotonic() < end, "the host did not finish the run"
            time.sleep(0.1)
        row = RunRecord.objects.get(pk=run_id)
        assert host.keeper is not None and row.held_by == host.keeper.id
    finally:
        EngineHost.reset()

    assert outcome("default", run_id) == ("success", {"text": "it weighs a box: 3 kg"})
    assert row.adoptions == 1
