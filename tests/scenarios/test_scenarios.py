"""The engine's scenarios on both buses: each outcome, each limit, crash and resume.

The same scenario body (``scenarios.py``) runs on the in-process bus and on the Celery
bus (real workers, PostgreSQL, Redis); both must give the same outcome and the same
log, event type for event type.
"""

from __future__ import annotations

from collections import Counter

import pytest
from asgiref.sync import async_to_sync

from aaa_django.runtime.event_types import LLM_ABANDONED, LLM_ATTEMPTED, RUN_COMPLETED

from .scenarios import RESUME_LOG, SCENARIOS


def run(coro_fn, *args):
    """Drive a coroutine from the (sync) test, on this thread's DB connection."""

    async def main():
        return await coro_fn(*args)

    return async_to_sync(main)()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(bus, name):
    scenario, outcome, expected, check = SCENARIOS[name]
    bus.expected_events = len(expected)

    result = run(scenario, bus)

    assert result.outcome.outcome == outcome, result.outcome
    assert [e.type for e in result.log] == expected
    for stream in {e.stream for e in result.log}:  # one end per run, whatever raced
        assert [e.type for e in result.log if e.stream == stream].count(RUN_COMPLETED) == 1
    assert len({e.id for e in result.log}) == len(result.log)
    check(result)
    assert result.errors == []


def test_the_seven_outcomes_are_covered():
    assert {o for _, o, _, _ in SCENARIOS.values()} == {
        "success",
        "no_solution",
        "timeout",
        "budget_exceeded",
        "invalid_input",
        "cancelled",
        "failed",
    }


@pytest.mark.parametrize("cut", [1, 2, 5, 9, 14, len(RESUME_LOG) - 1])
def test_resume_after_a_crash(bus, cut):
    from .scenarios import crash_resume

    bus.expected_events = len(RESUME_LOG)
    reference, resumed, adopted = run(crash_resume, bus, cut)

    assert [e.type for e in reference.log] == RESUME_LOG
    assert adopted == [resumed.log[0].stream]
    assert resumed.outcome == reference.outcome
    # the very same events, id for id (but the completion's, which names its run), and
    # for a model attempt the cut left without its result: recorded abandoned, made again
    cut_off = RESUME_LOG[cut - 1] == LLM_ATTEMPTED
    abandoned = [e for e in resumed.log if e.type == LLM_ABANDONED]
    again = [e for e in resumed.log if e.type == LLM_ATTEMPTED and e.data["attempt"] > 1]
    assert [(e.data["attempt"]) for e in abandoned] == [1] * cut_off == [e.data["attempt"] - 1 for e in again]
    same = lambda log: [
        (e.type, e.id if e.type != RUN_COMPLETED else None)  # noqa: E731
        for e in log
        if e not in abandoned and e not in again
    ]
    assert same(resumed.log) == same(reference.log)
    assert Counter(e.type for e in resumed.log)[RUN_COMPLETED] == 1
    assert resumed.errors == []
