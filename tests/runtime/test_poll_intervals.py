"""A run's end is polled (for an end no one announces) at intervals that double up to
``POLL_BACKOFF`` times the first: a thousand runs waited on at once in one process
must not read their logs a thousand times a second."""

from __future__ import annotations

from itertools import islice

from aaa_django.runtime.wakeups import POLL_BACKOFF, poll_intervals


def test_the_polls_back_off_to_a_bound_and_stay_there():
    waits = list(islice(poll_intervals(0.5), 7))

    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert max(waits) == 0.5 * POLL_BACKOFF
