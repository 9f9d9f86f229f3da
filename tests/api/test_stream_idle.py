"""While an event stream waits for the next event it holds no database connection
(on SQLite, which polls, and on PostgreSQL, woken by a NOTIFY); a wake-up that never comes (a lost NOTIFY) delays
it one heartbeat at most."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from aaa_django.api import runs, stream
from aaa_django.events import Event, new_id
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED, completion_id, started_id
from aaa_django.runtime.wakeups import Hub
from aaa_django.store import DjangoEventStore, runindex
from aaa_django.store.wakeups import Listener

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_waiting_stream_holds_no_sqlite_connection(alice, make_run):
    run_id = make_run(alice)  # running: the stream waits for more
    store = DjangoEventStore("default")
    held_while_waiting = []

    waits: list[float] = []

    class Polled(Hub):
        """Nothing wakes the stream (it polls); each wait passes at once, noting
        whether the stream holds a connection."""

        def subscribe(self, stream_id, loop=None):
            sub = super().subscribe(stream_id, loop)

            def wait(timeout: float) -> bool:
                waits.append(timeout)
                held_while_waiting.append(connections["default"].connection is not None)
                if len(held_while_waiting) == 3:  # then the run ends, and the stream with it
                    ended = store.append_sync(
                        [
                            Event(
                                id=completion_id(run_id), stream=run_id, type=RUN_COMPLETED, data={"outcome": "success"}
                            )
                        ]
                    )
                    runindex.index_events("default", ended)
                return False

            sub.wait = wait
            return sub

    body = list(stream.events(store, run_id, 0, shape=runs.event_out, max_seconds=60, ended=False, wakeups=Polled()))
    assert held_while_waiting == [False, False, False]
    assert waits == [stream.POLL] * 3  # not woken: it polls
    assert '"type":"aaa.run.completed"' in body[-1]


class Silent:
    """Wake-ups that say they are reliable and never wake anyone (a NOTIFY was lost)."""

    def __init__(self, clock: list[float], on_wait) -> None:
        self.clock, self.on_wait = clock, on_wait

    def reliable(self) -> bool:
        return True

    def subscribe(self, stream_id, loop=None):
        outer = self

        class Sub:
            def clear(self) -> None: ...

            def close(self) -> None: ...

            def wait(self, timeout: float) -> bool:
                outer.clock[0] += timeout  # the whole wait passes, nobody wakes us
                outer.on_wait()
                return False

        return Sub()


def test_a_lost_wake_up_delays_a_stream_one_heartbeat_at_most(alice, make_run):
    run_id = make_run(alice)
    store = DjangoEventStore("default")
    now = [0.0]
    sent_at: list[float] = []

    def on_wait() -> None:
        if not sent_at:  # the run ends during the first wait, and no wake-up comes
            sent_at.append(now[0])
            ended = store.append_sync(
                [Event(id=completion_id(run_id), stream=run_id, type=RUN_COMPLETED, data={"outcome": "success"})]
            )
            runindex.index_events("default", ended)

    body = list(
        stream.events(
            store,
            run_id,
            0,
            shape=runs.event_out,
            max_seconds=300,
            ended=False,
            wakeups=Silent(now, on_wait),
            clock=lambda: now[0],
        )
    )
    assert '"type":"aaa.run.completed"' in body[-1]  # read at the heartbeat, not at 300 s
    assert body[-2] == ": keep-alive\n\n" and now[0] <= stream.HEARTBEAT


@pytest.mark.django_db(transaction=True, databases=["postgres"])
def test_a_wsgi_stream_on_postgresql_waits_without_a_connection_and_wakes_on_an_append(pg_alias):
    """The sync iterator (a WSGI server's thread): no connection while it waits; another
    thread's append wakes it (NOTIFY)."""
    run_id = f"run-{new_id()}"
    store = DjangoEventStore(pg_alias)
    store.append_sync([Event(id=started_id(run_id), stream=run_id, type=RUN_STARTED, data={})])
    hub = Listener(pg_alias)
    hub.subscribe("warm-up").close()  # starts it listening
    assert hub.listening(10)
    held_while_waiting: list[bool] = []
    woken: list[bool] = []

    class Watched:
        """The real wake-ups; each wait notes whether the stream holds a connection, and
        the first one has another thread end the run."""

        def reliable(self) -> bool:
            return hub.reliable()

        def subscribe(self, stream_id, loop=None):
            sub = hub.subscribe(stream_id, loop)
            wait = sub.wait

            def watched(timeout: float) -> bool:
                held_while_waiting.append(connections[pg_alias].connection is not None)
                if len(held_while_waiting) == 1:
                    threading.Thread(
                        target=lambda: (
                            store.append_sync(
                                [
                                    Event(
                                        id=completion_id(run_id),
                                        stream=run_id,
                                        type=RUN_COMPLETED,
                                        data={"outcome": "success"},
                                    )
                                ]
                            ),
                            connections.close_all(),
                        )
                    ).start()
                woken.append(wait(timeout))
                return woken[-1]

            sub.wait = watched
            return sub

    try:
        body = list(
            stream.events(store, run_id, 0, shape=runs.event_out, max_seconds=60, ended=False, wakeups=Watched())
        )
    finally:
        hub.stop()
    # (a late notification of the run's start may wake it once for nothing)
    assert held_while_waiting in ([False], [False, False])  # no connection while waiting
    assert woken[-1] is True  # woken by the append's NOTIFY, not by a timeout
    assert '"type":"aaa.run.completed"' in body[-1]
