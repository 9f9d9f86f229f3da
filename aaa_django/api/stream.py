"""A run's events as Server-Sent Events, resumable with ``Last-Event-ID``.

Each event is one SSE message whose ``id`` is its ``seq`` and whose ``data`` is the
event as JSON (the same object ``GET /runs/{id}/events`` returns). A client that
reconnects sends the last id it saw and gets exactly the events after it. The
stream ends after ``aaa.run.completed``; reconnecting to a run that has ended, with
nothing left to send, gets ``204 No Content`` (which tells an ``EventSource`` to stop
reconnecting). A user holds at most ``AAA["API_STREAMS_PER_USER"]`` streams open at
once (:mod:`.streamcap`; past it: 429).

A stream reads the log when its run moves (:mod:`aaa_django.store.wakeups`: PostgreSQL
notifies; other databases poll), so it sees events appended by any process (Celery
workers included), and lets go of its database connection before it waits. What it
decides is written once (:func:`_plan`) and driven two ways: :func:`events`, an
iterator for a WSGI server (the stream has the request's thread), and
:func:`aevents`, an async iterator for an ASGI server: it holds no thread while it
waits, and reads on :data:`READERS` threads shared by the process's streams (so
streams use at most that many database connections at once).

With ``AAA["STREAM_TOKENS"]``, a model reply's text comes too, as it is written:
``event: token`` messages (no ``id``, so a reconnection's ``Last-Event-ID`` stays the
last event's) whose ``data`` is ``{"run_id", "request_id", "index", "text"}``, each
before the ``aaa.llm.completed`` it belongs to. An ``EventSource``'s ``onmessage``
does not see them; ``addEventListener("token", ...)`` does. Tokens are not stored: a
stream resumed later gets the reply's event alone. The token feed does not wake a
waiting stream: while it waits, a stream with tokens looks for them every
:data:`TOKEN_SLICE` seconds (a WSGI stream blocks on the feed for that long, an ASGI
one looks without blocking), and for its run's wake-up between two looks.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Generator, Iterator

from asgiref.sync import sync_to_async
from django.db import connections

from aaa_django.events import Event
from aaa_django.llm.deltas import TokenSubscription
from aaa_django.runtime.event_types import RUN_COMPLETED
from aaa_django.runtime.wakeups import Hub, Wakeups
from aaa_django.site.tokens import sse_message

from . import streamcap

#: seconds between two reads of a stream whose wake-ups are not reliable (it polls)
POLL = 0.25
#: seconds between keep-alive comments on an idle stream
HEARTBEAT = 15.0
#: seconds between checks that the run was not erased meanwhile (a stream that polls)
EXISTS_EVERY = 5.0
PAGE = 200
#: the client's reconnection delay, in milliseconds
RETRY_MS = 2000
#: seconds a stream that waits with live tokens on spends on the token feed between
#: two looks at its run's wake-up
TOKEN_SLICE = 0.25
#: threads on which the async streams of a process read the log (and so the most
#: database connections they use at once)
READERS = 4

# What _plan asks its driver to do.
SEND, READ, HEAD, RENEW, WAIT = "send", "read", "head", "renew", "wait"

Page = list[tuple[Event, str]]  # the events read, each with its SSE message


def message(event: dict) -> str:
    return f"id: {event['seq']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def _plan(after: int, *, ended: bool, max_seconds: float, renews: bool,
          reliable: Callable[[], bool], clock: Callable[[], float]
          ) -> Generator[tuple[str, Any], Any, None]:
    """The stream's decisions, as requests to its driver: ``(SEND, text)``,
    ``(READ, after)`` -> the page after that seq, ``(HEAD, None)`` -> the stream's head
    or None (erased), ``(RENEW, None)`` (the stream's slot), ``(WAIT, seconds)`` ->
    True if the run moved meanwhile. Returns when the stream should end."""
    yield SEND, f"retry: {RETRY_MS}\n\n"
    now = clock()
    stop_at = now + max_seconds
    last_write = last_check = last_renew = now
    woken = True
    while True:
        page: Page = yield READ, after
        for event, text in page:
            yield SEND, text
            after = event.seq or after
            if event.type == RUN_COMPLETED:
                return
        now = clock()
        if page:
            last_write = now
            if len(page) == PAGE:
                continue
        if ended:
            return  # resumed past the completion: what is stored has been sent
        trusted = reliable()
        # Woken with nothing new: the run's events were deleted (erasure notifies too).
        if (trusted and woken and not page) or (not trusted and now - last_check >= EXISTS_EVERY):
            last_check = now
            if (yield HEAD, None) is None:
                return  # erased
        while True:  # wait for the run to move, doing what falls due meanwhile
            now = clock()
            if now >= stop_at:
                return  # the client reconnects with Last-Event-ID
            if renews and now - last_renew >= streamcap.LEASE / 3:
                last_renew = now
                yield RENEW, None
            if now - last_write >= HEARTBEAT:
                last_write = now
                yield SEND, ": keep-alive\n\n"
                # and read as if woken (the run may have moved, or been erased): a lost
                # wake-up (a NOTIFY that failed) delays a stream this long at most
                woken = True
                break
            trusted = reliable()
            due = min(stop_at, last_write + HEARTBEAT,
                      last_renew + streamcap.LEASE / 3 if renews else stop_at)
            wait = max(due - now, 0.0)
            woken = yield WAIT, wait if trusted else min(wait, POLL)  # not woken: poll
            if woken or not trusted:
                break  # read


def letting_go(using: str, wakeups: Wakeups) -> Callable[[], None]:
    """What a stream on database ``using`` lets go of before it waits: its connection,
    when reopening it is cheap (SQLite) or rare (woken by notifications). A stream
    that polls PostgreSQL keeps it: reopening one four times a second would cost the
    server a process each time."""

    def idle() -> None:
        connection = connections[using]
        if connection.in_atomic_block:
            return
        if connection.vendor == "sqlite" or wakeups.reliable():
            connection.close()

    return idle


def reader(store: Any, run_id: str, shape: Callable[[Event], dict]) -> Callable[[int], Page]:
    def read(after: int) -> Page:
        return [(e, message(shape(e))) for e in store.read_sync(run_id, after=after, limit=PAGE)]

    return read


def events(
    store: Any,
    run_id: str,
    after: int,
    *,
    shape: Callable[[Event], dict],
    max_seconds: float,
    ended: bool,
    slot: Any = None,
    wakeups: Wakeups | None = None,
    subscribe: Callable[[], TokenSubscription | None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[str]:
    """The SSE text of the run's events after ``after``, until the completion (or, for
    a run that had ``ended`` before the stream opened, until what is stored is sent),
    read on the calling thread (a WSGI server's request thread). ``slot``
    (:class:`~aaa_django.api.streamcap.Slot`): renewed while the stream runs, given
    back when it ends, however it ends. ``wakeups``: what wakes it (default: none; it
    polls). ``subscribe``: the run's live tokens, sent between its events."""
    wakeups = wakeups if wakeups is not None else Hub()  # (polls)
    read, idle = reader(store, run_id, shape), letting_go(store.using, wakeups)
    sub = wakeups.subscribe(run_id)
    plan = _plan(after, ended=ended, max_seconds=max_seconds, renews=slot is not None,
                 reliable=wakeups.reliable, clock=clock)
    tokens = None
    try:
        # subscribed before the first read: a delta whose reply is not read yet is ours
        tokens = subscribe() if subscribe is not None and not ended else None
        reply: Any = None
        while True:
            try:
                op, arg = plan.send(reply)
            except StopIteration:
                return
            reply = None
            if op == SEND:
                yield arg
            elif op == READ:
                sub.clear()
                reply = read(arg)
                if tokens is not None:
                    # Deltas come before the page: one published before its reply was
                    # appended is in hand now, and so goes out before the reply's event.
                    for delta in tokens.wait(0):
                        yield sse_message(delta)
            elif op == HEAD:
                reply = store.head_sync(run_id)
            elif op == RENEW:
                slot.renew()
            else:
                idle()
                if tokens is None:
                    reply = sub.wait(arg)
                    continue
                end = clock() + arg
                while True:  # the tokens as they come; the run's wake-up between two looks
                    for delta in tokens.wait(min(max(end - clock(), 0.0), TOKEN_SLICE)):
                        yield sse_message(delta)
                    reply = sub.wait(0)
                    if reply or clock() >= end:
                        break
    finally:
        if tokens is not None:
            tokens.close()
        sub.close()
        if slot is not None:
            slot.release()


_readers: ThreadPoolExecutor | None = None


def _on_reader(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a coroutine function run on one of the :data:`READERS` threads."""
    global _readers
    if _readers is None:
        _readers = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="aaa-stream")
    return sync_to_async(fn, thread_sensitive=False, executor=_readers)


def _close_connections() -> None:
    """Close this thread's database connections (outside a transaction)."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()


async def aevents(
    store: Any,
    run_id: str,
    after: int,
    *,
    shape: Callable[[Event], dict],
    max_seconds: float,
    ended: bool,
    slot: Any = None,
    wakeups: Wakeups | None = None,
    subscribe: Callable[[], TokenSubscription | None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[str]:
    """:func:`events` for an ASGI server: waits on the event loop (no thread), and
    reads on the process's :data:`READERS` threads, letting go of their connection
    after each read as :func:`events` does before each wait."""
    wakeups = wakeups if wakeups is not None else Hub()  # (polls)
    # The view ran on the request's thread, whose connection Django closes only when
    # the response ends: close it now (the view and middleware are done with it).
    await sync_to_async(_close_connections, thread_sensitive=True)()
    read_, idle = reader(store, run_id, shape), letting_go(store.using, wakeups)

    def read(after: int) -> Page:
        try:
            return read_(after)
        finally:
            idle()

    def head() -> Any:
        try:
            return store.head_sync(run_id)
        finally:
            idle()

    sub = wakeups.subscribe(run_id, asyncio.get_running_loop())
    plan = _plan(after, ended=ended, max_seconds=max_seconds, renews=slot is not None,
                 reliable=wakeups.reliable, clock=clock)
    tokens = None
    try:
        # subscribed before the first read (a Redis subscription waits for Redis to
        # confirm it: on a reader thread)
        if subscribe is not None and not ended:
            tokens = await _on_reader(subscribe)()
        reply: Any = None
        while True:
            try:
                op, arg = plan.send(reply)
            except StopIteration:
                return
            reply = None
            if op == SEND:
                yield arg
            elif op == READ:
                sub.clear()
                reply = await _on_reader(read)(arg)
                if tokens is not None:  # (before the page, as in ``events``)
                    for delta in tokens.wait(0):
                        yield sse_message(delta)
            elif op == HEAD:
                reply = await _on_reader(head)()
            elif op == RENEW:
                await _on_reader(slot.renew)()
            elif tokens is None:
                reply = await sub.until(arg)
            else:
                end = clock() + arg
                while True:  # a look at the tokens (not blocking), then the wake-up
                    for delta in tokens.wait(0):
                        yield sse_message(delta)
                    reply = await sub.until(min(max(end - clock(), 0.0), TOKEN_SLICE))
                    if reply or clock() >= end:
                        break
    finally:
        if tokens is not None:
            await _on_reader(tokens.close)()
        sub.close()
        if slot is not None:
            await _on_reader(slot.release)()
