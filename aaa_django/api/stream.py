"""A run's events as Server-Sent Events, resumable with ``Last-Event-ID``.

Each event is one SSE message whose ``id`` is its ``seq`` and whose ``data`` is the
event as JSON (the same object ``GET /runs/{id}/events`` returns). A client that
reconnects sends the last id it saw and gets exactly the events after it. The
stream ends after ``aaa.run.completed``; reconnecting to a run that has ended, with
nothing left to send, gets ``204 No Content`` (which tells an ``EventSource`` to stop
reconnecting). The stream polls the log, so it sees events appended by any process
(Celery workers included). A user holds at most ``AAA["API_STREAMS_PER_USER"]``
streams open at once (:mod:`.streamcap`; past it: 429).

With ``AAA["STREAM_TOKENS"]``, a model reply's text comes too, as it is written:
``event: token`` messages (no ``id``, so a reconnection's ``Last-Event-ID`` stays the
last event's) whose ``data`` is ``{"run_id", "request_id", "index", "text"}``, each
before the ``aaa.llm.completed`` it belongs to. An ``EventSource``'s ``onmessage``
does not see them; ``addEventListener("token", ...)`` does. Tokens are not stored: a
stream resumed later gets the reply's event alone.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterator

from aaa_django.events import Event
from aaa_django.llm.deltas import TokenDelta, TokenSubscription
from aaa_django.runtime.event_types import RUN_COMPLETED
from aaa_django.store import DjangoEventStore

from . import streamcap

#: seconds between reads of the log while nothing new arrives
POLL = 0.25
#: seconds between keep-alive comments on an idle stream
HEARTBEAT = 15.0
#: seconds between checks that the run was not erased meanwhile
EXISTS_EVERY = 5.0
PAGE = 200
#: the client's reconnection delay, in milliseconds
RETRY_MS = 2000


def message(event: dict) -> str:
    return f"id: {event['seq']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def token_message(delta: TokenDelta) -> str:
    return f"event: token\ndata: {json.dumps(delta.to_dict(), separators=(',', ':'))}\n\n"


def events(
    store: DjangoEventStore,
    run_id: str,
    after: int,
    *,
    shape: Callable[[Event], dict],
    max_seconds: float,
    ended: bool,
    slot: Any = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    subscribe: Callable[[], TokenSubscription | None] | None = None,
) -> Iterator[str]:
    """The SSE text of the run's events after ``after``, until the completion (or, for
    a run that had ``ended`` before the stream opened, until what is stored is sent);
    with ``subscribe``, the run's live tokens between them. ``slot``
    (:class:`~aaa_django.api.streamcap.Slot`): renewed while the stream runs, given
    back when it ends, however it ends."""
    # subscribed before the first read: a delta whose reply is not read yet is ours
    try:
        tokens = subscribe() if subscribe is not None and not ended else None
        try:
            yield from _events(store, run_id, after, shape=shape, max_seconds=max_seconds, ended=ended,
                               slot=slot, clock=clock, sleep=sleep, tokens=tokens)
        finally:
            if tokens is not None:
                tokens.close()
    finally:
        if slot is not None:
            slot.release()


def _events(
    store: DjangoEventStore,
    run_id: str,
    after: int,
    *,
    shape: Callable[[Event], dict],
    max_seconds: float,
    ended: bool,
    slot: Any,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    tokens: TokenSubscription | None,
) -> Iterator[str]:
    yield f"retry: {RETRY_MS}\n\n"
    stop_at = clock() + max_seconds
    last_write = last_check = last_renew = clock()
    while True:
        page = store.read_sync(run_id, after=after, limit=PAGE)
        if tokens is not None:
            # Deltas come before the page: one published before its reply was appended
            # is in hand now, and so goes out before the reply's event.
            for delta in tokens.wait(0):
                yield token_message(delta)
        for e in page:
            yield message(shape(e))
            after = e.seq or after
            if e.type == RUN_COMPLETED:
                return
        now = clock()
        if page:
            last_write = now
            if len(page) == PAGE:
                continue
        if ended and len(page) < PAGE:
            return  # resumed past the completion: what is stored has been sent
        if now >= stop_at:
            return  # the client reconnects with Last-Event-ID
        if now - last_check >= EXISTS_EVERY:
            last_check = now
            if store.head_sync(run_id) is None:
                return  # erased meanwhile
        if slot is not None and now - last_renew >= streamcap.LEASE / 3:
            last_renew = now
            slot.renew()
        if now - last_write >= HEARTBEAT:
            last_write = now
            yield ": keep-alive\n\n"
        if tokens is None:
            sleep(POLL)
            continue
        next_read = clock() + POLL
        while (left := next_read - clock()) > 0:  # tokens as they come; the log every POLL
            for delta in tokens.wait(left):
                last_write = clock()
                yield token_message(delta)
