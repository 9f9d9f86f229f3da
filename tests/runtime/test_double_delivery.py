"""At-least-once, kept honest: delivering every event twice writes the same log.

Same event types and ids in the same order, same outcome, for every scenario.
"""

from __future__ import annotations

import pytest

from .helpers import arun, trace
from .scenarios import EXPECTED


def comparable(outcome):
    """The outcome without wall-clock values (a deadline is "now + seconds")."""
    value = outcome.value
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "deadline"}
    return outcome.outcome, value


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_event_delivered_twice_gives_the_same_log(name):
    scenario = EXPECTED[name][0]
    once = arun(scenario(False))
    twice = arun(scenario(True))
    assert twice.engine.bus.copies == 2
    assert comparable(twice.outcome) == comparable(once.outcome)
    assert trace(twice.log) == trace(once.log)
    assert twice.engine.errors == [] and twice.engine.bus.errors == []
