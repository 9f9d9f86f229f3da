"""Run by tests/install inside a fresh virtualenv, on a site the test wrote:

    python probe.py CONFIG.json RESULT.json      (DJANGO_SETTINGS_MODULE set)

Sets Django up, runs the system checks (``manage.py check``), imports the modules the
config names, makes the uses it names of the extras, and writes what happened as JSON:
what the checks said, each import's traceback (or null), each use's result, and which
of the optional packages got imported. Needs only the standard library, Django and the
installed package (it imports nothing from tests/).
"""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable


def demo() -> dict[str, Any]:
    """The site's database migrated, then ``manage.py aaa_demo``: one run of a ToolLoop
    with the scripted model, on the site's store (and its observers: OpenTelemetry)."""
    from django.core.management import call_command

    out = io.StringIO()
    call_command("migrate", verbosity=0, stdout=out)
    call_command("aaa_demo", "--quiet", stdout=out)
    return {"output": out.getvalue()}


def migrate() -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM aaa_event")
        (events,) = cursor.fetchone()
    return {"vendor": connection.vendor, "events": events}


def llm_client() -> dict[str, Any]:
    """The model client ``AAA["LLM"]`` configures (it imports its SDK when made)."""
    from aaa_django.site.llm_settings import client_from_settings

    return {"client": type(client_from_settings()).__name__}


def provider_clients() -> dict[str, Any]:
    """The OpenAI-compatible and the Anthropic clients, as a site's ``LLM_CLIENT`` factory
    makes them (each imports its SDK when made)."""
    from aaa_django.llm.anthropic_client import AnthropicClient
    from aaa_django.llm.openai_client import OpenAICompatibleClient

    made = [
        OpenAICompatibleClient(None, "install-profile", "gpt-4o-mini"),
        AnthropicClient(None, "install-profile", "claude-haiku-4-5"),
    ]
    return {"clients": [type(client).__name__ for client in made]}


def celery_bus() -> dict[str, Any]:
    """``AAA["BUS"] = "celery"``: the bus the Celery adapter registered, and its tasks."""
    from celery import current_app

    import aaa_django.celery.tasks  # noqa: F401  (what a site's autodiscover_tasks() finds)
    from aaa_django.conf import aaa_settings
    from aaa_django.site.buses import site_bus

    bus = site_bus(aaa_settings()["BUS"])
    return {"bus": type(bus).__name__, "tasks": sorted(t for t in current_app.tasks if t.startswith("aaa."))}


def blobs() -> dict[str, Any]:
    """A blob written to and read back from ``AAA["BLOB_STORAGE"]``."""
    from aaa_django.site.engines import site_blobs

    store = site_blobs()
    assert store is not None
    ref = store.put(b"an install profile's blob", "text/plain")
    return {"storage": type(store.storage).__name__, "read": store.get(ref).decode()}


def agent_run() -> dict[str, Any]:
    """The ``AAA["AGENTS"]`` loaded, and one run of the first, durably, on the in-memory
    engine, its model the one ``AAA["LLM"]`` configures."""
    from django.conf import settings

    from aaa_django.algos import PydanticAIAgent
    from aaa_django.algos.pydantic_agent import list_agent_tools
    from aaa_django.llm import LLMHandler
    from aaa_django.runtime import Engine
    from aaa_django.site.engines import load_agents
    from aaa_django.site.llm_settings import client_from_settings
    from aaa_django.tools import ToolHandler, ToolRegistry

    (agent,) = load_agents()
    module, _, name = settings.AAA["AGENTS"][0].rpartition(".")

    async def run() -> Any:
        async with Engine() as engine:
            LLMHandler(client_from_settings()).attach(engine)
            ToolHandler(ToolRegistry(await list_agent_tools(agent))).attach(engine)
            started = await engine.start(PydanticAIAgent(f"{module}:{name}"), {"task": "Go."})
            outcome = await started.result(timeout=60)
            return outcome.outcome, [e.type for e in await started.events()]

    outcome, types = asyncio.run(run())
    return {"agent": type(agent).__name__, "outcome": outcome, "types": types}


def mcp_tools() -> dict[str, Any]:
    """The tools of the ``AAA["MCP_SERVERS"]``, listed from each server (started now)."""
    from aaa_django.site.mcp_settings import mcp_tools as listed

    return {"tools": sorted(t.name for t in listed())}


def contract_suite() -> dict[str, Any]:
    """pytest runs the site's own test of a store against the package's contract suite."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_contract.py"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {"returncode": done.returncode, "output": done.stdout[-3000:] + done.stderr[-3000:]}


USES: dict[str, Callable[[], dict[str, Any]]] = {
    f.__name__: f
    for f in (demo, migrate, llm_client, provider_clients, celery_bus, blobs, agent_run, mcp_tools, contract_suite)
}


def main(config_path: str, result_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    result: dict[str, Any] = {"imports": {}, "uses": {}}
    import django

    django.setup()
    from django.core.management import call_command

    import aaa_django

    result["package"] = aaa_django.__file__

    out = io.StringIO()
    try:
        call_command("check", stdout=out, stderr=out)
        result["check"] = {"passed": True, "output": out.getvalue()}
    except Exception as exc:  # SystemCheckError: what `manage.py check` prints
        result["check"] = {"passed": False, "output": f"{out.getvalue()}{type(exc).__name__}: {exc}"}
    for name in config["modules"]:
        try:
            importlib.import_module(name)
            result["imports"][name] = None
        except Exception:
            result["imports"][name] = traceback.format_exc()
    for use in config["uses"]:
        try:
            result["uses"][use] = USES[use]()
        except Exception:
            result["uses"][use] = {"error": traceback.format_exc()}
    result["optional"] = sorted(m for m in config["optional"] if m in sys.modules)
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
