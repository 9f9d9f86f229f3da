"""What the admin tests run: a scripted model, two tools, and helpers.

The model is scripted (``FakeLLMClient``): it asks for one tool, then answers with
text. ``lookup`` returns a long text, so its result (and the next model request) are
claim-checked into the blob store; ``deploy`` waits at an approval gate.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from aaa_django.algos import FSM, ToolLoop, WorkflowGraph
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


@tool
def fetch(url: str) -> str:
    """Fetch a page (the network is down: it always fails)."""
    raise ConnectionError(f"cannot reach {url}")


TOOLS = ["tests.admin.support.lookup", "tests.admin.support.deploy", "tests.admin.support.fetch"]

#: a WorkflowGraph: the page fetch fails and its fallback answers; the long lookup is
#: claim-checked; ``ship`` (added by ``workflow(ship=True)``) waits for an approval
ARTICLE = [
    {"id": "outline", "prompt": "Outline an article about {task}."},
    {"id": "page", "kind": "tool", "tool": "fetch", "args": {"url": "{task}"}, "fallback": "recall"},
    {"id": "recall", "prompt": "What do you know about {task}? ({error})"},
    {"id": "sources", "kind": "tool", "tool": "lookup", "args": {"topic": "{task}"}},
    {"id": "draft", "prompt": "Write it: {outline} {page} {sources}", "after": ["outline", "page", "sources"]},
    {"id": "title", "prompt": "A title for {outline}", "after": ["outline"]},
]
SHIP = {"id": "ship", "kind": "tool", "tool": "deploy", "args": {"service": "{title}"}, "after": ["draft", "title"]}

#: an FSM whose model's labels are scripted by state entered (``fsm-N``): triage and
#: investigate go round twice, then the answer is sent
SUPPORT_FSM = {
    "states": {
        "triage": {"prompt": "Triage: {task}", "transitions": {"bug": "investigate", "question": "answer"}},
        "investigate": {"prompt": "Investigate: {last}", "transitions": {"found": "answer", "unclear": "triage"}},
        "answer": {"prompt": "Answer: {last}", "transitions": {"sent": "done", "escalate": "human"}},
    },
    "initial": "triage",
    "finals": ["done", "human"],
}
FSM_LABELS = ["bug", "unclear", "bug", "found", "sent"]


def script(request: Any) -> Any:
    tag = request.tag or ""
    if tag.startswith("node-"):  # a WorkflowGraph's node
        return text(f"{tag.removeprefix('node-')}: done")
    if tag.startswith("fsm-"):  # an FSM's state: its label by the order it was entered
        labels = FSM_LABELS[:2] * _rounds(request) + FSM_LABELS
        return text(f"Noted.\nNEXT: {labels[min(int(tag.removeprefix('fsm-')), len(labels) - 1)]}")
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


def workflow(ship: bool = False) -> WorkflowGraph:
    return WorkflowGraph(nodes=[*ARTICLE, *([SHIP] if ship else [])])


def _rounds(request: Any) -> int:
    """How many times an FSM run goes round triage and investigate before its usual
    path: N when its system prompt says "round N times" (a long run), else 0."""
    said = " ".join(m.content or "" for m in request.messages if m.role == "system")
    found = re.search(r"round (\d+) times", said)
    return int(found.group(1)) if found else 0


def machine() -> FSM:
    return FSM(**SUPPORT_FSM)


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
