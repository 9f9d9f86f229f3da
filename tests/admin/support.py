"""What the admin tests run: a scripted model, two tools, and helpers.

The model is scripted (``FakeLLMClient``): it asks for one tool, then answers with
text. ``lookup`` returns a long text, so its result (and the next model request) are
claim-checked into the blob store; ``deploy`` waits at an approval gate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from aaa_django.algos import ToolLoop
from aaa_django.llm import FakeLLMClient
from aaa_django.llm.fake import text, tool_call
from aaa_django.tools import ToolRegistry, tool

#: a result long enough to be claim-checked at CLAIM_THRESHOLD below
LONG = " ".join(f"fact-{i}: the admin shows claim-checked payloads." for i in range(60))
CLAIM_THRESHOLD = 1024


@tool
def lookup(topic: str) -> dict:
    """Look a topic up (returns a long document)."""
    return {"topic": topic, "document": LONG}


#: how long a deployment takes: long enough for a browser to see the run still running
DEPLOY_SECONDS = 0.8


@tool(requires_approval=True)
def deploy(service: str) -> str:
    """Deploy a service (needs a human's approval)."""
    time.sleep(DEPLOY_SECONDS)
    return f"deployed {service}"


TOOLS = ["tests.admin.support.lookup", "tests.admin.support.deploy"]


def script(request: Any) -> Any:
    task = next((m.content or "" for m in request.messages if m.role == "user"), "")
    results = [m for m in request.messages if m.role == "tool"]
    if not results:
        if "deploy" in task:
            return tool_call("deploy", service="web")
        return tool_call("lookup", topic="admin")
    return text(f"Done after {len(results)} tool call(s): {results[-1].content[:40]}")


def fake_client() -> FakeLLMClient:
    """AAA["LLM_CLIENT"] of the tests: the scripted model."""
    return FakeLLMClient(script)


def loop(**config: Any) -> ToolLoop:
    return ToolLoop(ToolRegistry([lookup, deploy]), max_turns=4, **config)


class Summary(BaseModel):
    """A structured result the scripted model never gives (it answers in prose)."""

    topic: str
    facts: int


def wait_until(check: Callable[[], Any], timeout: float = 15.0, every: float = 0.02) -> Any:
    end = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(every)
    return value


def blob_files(media_root: Path, sha256: str) -> list[Path]:
    """The stored file(s) of a blob in a FileSystemStorage (to tamper with them)."""
    return [p for p in media_root.rglob(sha256) if p.is_file()]
