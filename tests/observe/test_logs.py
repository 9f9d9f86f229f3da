"""Log lines with their run: every record written during a delivery carries the run
id, seq and event type (aaa_django.runtime.logcontext), on the in-process bus; on
Celery workers: tests/celery/test_observe.py."""

from __future__ import annotations

import json
import logging

from aaa_django.algos import ToolLoop
from aaa_django.llm.fake import text, tool_calls
from aaa_django.runtime.event_types import LLM_REQUESTED, TOOL_REQUESTED
from aaa_django.runtime.logcontext import DeliveryContext, JsonFormatter
from aaa_django.tools import ToolRegistry, tool
from tests.runtime.helpers import arun, make_engine

log = logging.getLogger("tests.observe")


@tool
async def chatty(n: int = 0) -> int:
    """Logs a line."""
    log.warning("chatty ran with n=%s", n)
    return n


REGISTRY = ToolRegistry([chatty])


def model(request):
    if any(m.role == "tool" for m in request.messages):
        log.warning("the model answers")
        return text("done")
    return tool_calls(("chatty", {"n": 7}))


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(DeliveryContext())
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        record.json = self.format(record)
        self.records.append(record)


def test_log_records_carry_the_event_being_delivered():
    handler = Collect()
    log.addHandler(handler)
    try:

        async def main():
            async with make_engine(model, REGISTRY) as engine:
                run = await engine.start(ToolLoop(REGISTRY), {"task": "go"})
                await run.result(timeout=10)
                log.warning("after the run")
                return run.run_id, await run.events()

        run_id, events = arun(main())
    finally:
        log.removeHandler(handler)

    tool_request = next(e for e in events if e.type == TOOL_REQUESTED)
    second_call = [e for e in events if e.type == LLM_REQUESTED][1]
    seen = {r.getMessage(): (r.run_id, r.seq, r.event_type) for r in handler.records}
    assert seen == {
        "chatty ran with n=7": (run_id, tool_request.seq, TOOL_REQUESTED),
        "the model answers": (run_id, second_call.seq, LLM_REQUESTED),
        "after the run": (None, None, None),  # outside any delivery
    }
    lines = {json.loads(r.json)["message"]: json.loads(r.json) for r in handler.records}
    assert {k: lines["chatty ran with n=7"][k] for k in ("run_id", "seq", "event_type", "logger", "level")} == {
        "run_id": run_id,
        "seq": tool_request.seq,
        "event_type": TOOL_REQUESTED,
        "logger": "tests.observe",
        "level": "WARNING",
    }
    assert "run_id" not in lines["after the run"]


def test_the_json_formatter_keeps_extras_and_tracebacks():
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("here",), None)
    record.order = {"id": 7}
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    out = json.loads(JsonFormatter().format(record))
    assert (out["message"], out["order"], out["level"]) == ("failed here", {"id": 7}, "ERROR")
    assert out["exc_info"].endswith("ValueError: boom")
