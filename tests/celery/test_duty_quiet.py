"""The workers' periodic duty logs at DEBUG unless it did something: Celery's own lines
about each ``aaa.tick`` are demoted (``QuietDuty``), and the duty's turn says at INFO
only what it fired, adopted or re-drove."""

from __future__ import annotations

import asyncio
import logging

from aaa_django.celery.duty import TICK, QuietDuty, install
from aaa_django.celery.sweeper import duty
from aaa_django.events import InMemoryEventStore
from aaa_django.runtime import Engine


def record(name: str, task: str, level: int = logging.INFO) -> logging.LogRecord:
    context = {"id": "t-1", "name": task, "runtime": 0.01, "return_value": "{}", "args": "()", "kwargs": "{}"}
    rec = logging.LogRecord(name, level, __file__, 1, "Task %(name)s[%(id)s] succeeded", (context,), None)
    rec.data = context  # as Celery passes it (celery.app.trace.info)
    return rec


def test_celerys_lines_about_a_tick_are_debug_and_the_others_are_untouched(caplog):
    install()
    trace = logging.getLogger("celery.app.trace")
    assert any(isinstance(f, QuietDuty) for f in trace.filters)
    assert any(isinstance(f, QuietDuty) for f in logging.getLogger("celery.worker.strategy").filters)
    caplog.set_level(logging.INFO, logger="celery.app.trace")
    tick, deliver = record(trace.name, TICK), record(trace.name, "aaa.deliver")

    trace.handle(tick)
    trace.handle(deliver)

    assert [r.getMessage() for r in caplog.records] == [deliver.getMessage()]
    assert (tick.levelno, deliver.levelno) == (logging.DEBUG, logging.INFO)
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="celery.app.trace")
    trace.handle(record(trace.name, TICK))
    assert [r.levelname for r in caplog.records] == ["DEBUG"]  # there at -l debug


def test_a_duty_turn_that_does_nothing_says_nothing(caplog):
    caplog.set_level(logging.DEBUG, logger="aaa_django")

    async def turn():
        async with Engine(store=InMemoryEventStore()) as engine:
            return await duty(engine, None, sweeping=False), await duty(engine, None, sweeping=True)

    quiet, swept = asyncio.run(turn())
    assert not quiet.did_something() and not swept.did_something()
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
