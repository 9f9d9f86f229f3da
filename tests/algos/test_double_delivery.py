"""At-least-once, kept honest for every algorithm: delivering every event twice writes
the same log (same event types and ids in the same order) and the same outcome."""

from __future__ import annotations

import pytest

from tests.runtime.helpers import arun, trace
from tests.runtime.test_double_delivery import comparable

from .scenarios import EXPECTED


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_event_delivered_twice_gives_the_same_log(name):
    run = EXPECTED[name].run
    once = arun(run(False))
    twice = arun(run(True))
    assert twice.engine.bus.copies == 2
    assert comparable(twice.outcome) == comparable(once.outcome)
    assert trace(twice.log) == trace(once.log)
    assert twice.engine.errors == [] and twice.engine.bus.errors == []
