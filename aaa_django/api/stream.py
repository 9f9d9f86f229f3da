"""Server-Sent Events, written once for both servers: a run's events, and the runs' changes.

Every stream of the API is the same loop (:func:`plan`): subscribe, read what comes
after the cursor, send it (the live tokens in hand first), wait until something moves
(or poll), send a keep-alive comment when idle, renew the stream's slot, end after
``API_STREAM_SECONDS`` (the client reconnects with ``Last-Event-ID``), after the feed's
last message, or when the feed is gone. What a stream reads is a :class:`Feed`:
:class:`RunEvents` here (a run's log, whose ``id`` is the event's seq, ending after
``aaa.run.completed``), the runs' changes in :mod:`.changes`. The plan is a generator
that does no I/O: every message it sends, in its order, is decided there; it asks its
driver for each subscription, read, look at the tokens, wait or write, and the driver
is one of two, the same for every feed, each only carrying out those requests and
giving back what the stream held, however it ends:

- :func:`drive` for a WSGI server: the stream has the request's thread, reads on it,
  lets go of its database connection and blocks (on a thread event, or on the token
  feed) where it waits;
- :func:`adrive` for an ASGI server: an async iterator that waits on the event loop
  holding no thread, and reads on :data:`READERS` threads shared by the process's
  streams (so they use at most that many database connections at once).

Why a plan driven twice rather than one async generator that WSGI would run through
``async_to_sync``: under WSGI each chunk would then cross to an event loop on another
thread (and each wait would need that loop to live as long as the stream), where the
plan's driver waits on the request's own thread with nothing else running; a stream
costs a WSGI server one thread, as any of its views does, and no more.

:func:`respond` picks the driver for the request. A stream reads when its feed's
wake-up comes (:mod:`aaa_django.store.wakeups`: PostgreSQL notifies, so a stream sees
what any process appended, Celery workers included; other databases poll every
:data:`POLL` seconds). A user holds at most ``AAA["API_STREAMS_PER_USER"]`` streams
open at once (:mod:`.streamcap`; past it: 429).

A run's events: each event is one message whose ``id`` is its ``seq`` and whose
``data`` is the event as JSON (the object ``GET /runs/{id}/events`` returns). A client
that reconnects sends the last id it saw and gets exactly the events after it. The
stream ends after ``aaa.run.completed``; reconnecting to a run that has ended, with
nothing left to send, gets ``204 No Content`` (which tells an ``EventSource`` to stop
reconnecting).

With ``AAA["STREAM_TOKENS"]``, a model reply's text comes too, as it is written:
``event: token`` messages (no ``id``, so a reconnection's ``Last-Event-ID`` stays the
last event's) whose ``data`` is ``{"run_id", "request_id", "index", "text"}``, each
before the ``aaa.llm.completed`` it belongs to. An ``EventSource``'s ``onmessage``
does not see them; ``addEventListener("token", ...)`` does. Tokens are not stored: a
stream resumed later gets the reply's event alone. The token feed does not wake a
waiting stream: while it waits, a stream with tokens looks for them every
:data:`TOKEN_SLICE` seconds (a WSGI stream blocks on the feed for that long and then
looks at its wake-up; an ASGI one waits that long for its wake-up and then looks at
the feed without blocking).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import HttpRequest, StreamingHttpResponse

from aaa_django.conf import aaa_settings
from aaa_django.events import Event
from aaa_django.llm.deltas import TokenSubscription
from aaa_django.runtime.event_types import RUN_COMPLETED
from aaa_django.runtime.wakeups import Hub, Subscription, Wakeups
from aaa_django.site.tokens import sse_message

from . import streamcap
from .errors import ApiError

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
#: two looks at its wake-up
TOKEN_SLICE = 0.25
#: threads on which the async streams of a process read (and so the most database
#: connections they use at once)
READERS = 4

# What plan asks its driver to do.
OPEN, SEND, READ, TOKENS, HEAD, RENEW, WAIT, SLEEP = (
    "open",
    "send",
    "read",
    "tokens",
    "head",
    "renew",
    "wait",
    "sleep",
)
# Where a driver blocks while its stream waits with live tokens (its reply to OPEN): on
# the token feed (its wake-up then looked at), or on its wake-up (the feed looked at).
ON_TOKENS, ON_WAKEUP = "on-tokens", "on-wake-up"

#: a plan: requests ``(op, argument)`` in, each answered by the driver's reply
Steps = Generator[tuple[str, Any], Any, None]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Page:
    """What one read of a feed found: each message's text and whether the stream ends
    after it; the cursor after them; ``more``: a full page (read on at once); ``held``:
    there is more that cannot be sent yet (read again within :data:`POLL`)."""

    items: list[tuple[str, bool]]
    after: Any
    more: bool = False
    held: bool = False


class Feed(Protocol):
    """What a stream reads: ``read(after)`` the page after a cursor, on a thread that
    may use the database; ``head()`` whether there is still something to read (False:
    end the stream; None: not asked, the feed never goes away); ``key`` what it is
    woken by (a run's id, or :data:`aaa_django.store.wakeups.ANY`); ``using`` its
    database."""

    @property
    def key(self) -> str: ...

    @property
    def using(self) -> str: ...

    def read(self, after: Any) -> Page: ...

    def head(self) -> bool | None: ...


def plan(
    after: Any,
    *,
    ended: bool,
    max_seconds: float,
    renews: bool,
    reliable: Callable[[], bool],
    clock: Callable[[], float],
    checks_head: bool = True,
    gap: float = 0.0,
) -> Steps:
    """A stream's decisions, as requests to its driver: ``(OPEN, tokens)`` (subscribe
    to the feed's wake-ups, and to its live tokens if ``tokens``) -> None without live
    tokens, else where the driver blocks while it waits (:data:`ON_TOKENS` or
    :data:`ON_WAKEUP`); ``(SEND, text)``; ``(READ, after)`` -> the :class:`Page` after
    that cursor; ``(TOKENS, seconds)`` -> the deltas that came, blocking on the feed
    that long at most; ``(HEAD, None)`` -> the feed's ``head()``; ``(RENEW, None)``
    (the stream's slot); ``(WAIT, seconds)`` -> True if woken meanwhile; ``(SLEEP,
    seconds)``. Returns when the stream should end. ``ended``: send what there is (no
    tokens), then end; ``checks_head``: ask whether the feed is still there when
    woken with nothing new (an erased run); ``gap``: seconds between two reads at
    least (a feed woken by every append)."""
    # Subscribed before the first read: a delta whose reply is not read yet is ours.
    live = yield OPEN, not ended
    yield SEND, f"retry: {RETRY_MS}\n\n"
    now = clock()
    stop_at = now + max_seconds
    last_write = last_check = last_renew = now
    last_read: float | None = None
    woken = True
    while True:
        if gap and last_read is not None and (pause := last_read + gap - clock()) > 0:
            yield SLEEP, pause
        last_read = clock()
        page: Page = yield READ, after
        if live:
            # Deltas come before the page: one published before its reply was appended
            # is in hand now, and so goes out before the reply's event.
            for delta in (yield TOKENS, 0.0):
                yield SEND, sse_message(delta)
        for text, last in page.items:
            yield SEND, text
            if last:
                return
        after = page.after
        now = clock()
        if page.items:
            last_write = now
            if page.more:
                continue
        if ended:
            return  # what there is has been sent
        trusted = reliable()
        # Woken with nothing new: the run's events were deleted (erasure notifies too).
        if checks_head and (
            (trusted and woken and not page.items) or (not trusted and now - last_check >= EXISTS_EVERY)
        ):
            last_check = now
            if (yield HEAD, None) is False:
                return  # erased
        while True:  # wait for the feed to move, doing what falls due meanwhile
            now = clock()
            if now >= stop_at:
                return  # the client reconnects with Last-Event-ID
            if renews and now - last_renew >= streamcap.LEASE / 3:
                last_renew = now
                yield RENEW, None
            if now - last_write >= HEARTBEAT:
                last_write = now
                yield SEND, ": keep-alive\n\n"
                # and read as if woken (the feed may have moved, or gone): a lost
                # wake-up (a NOTIFY that failed) delays a stream this long at most
                woken = True
                break
            polls = page.held or not reliable()
            due = min(stop_at, last_write + HEARTBEAT, last_renew + streamcap.LEASE / 3 if renews else stop_at)
            wait = max(due - now, 0.0)
            wait = min(wait, POLL) if polls else wait
            if live is None:
                woken = yield WAIT, wait
            else:  # the tokens as they come, the wake-up between two looks
                end = clock() + wait
                while True:
                    block = min(max(end - clock(), 0.0), TOKEN_SLICE) if live == ON_TOKENS else 0.0
                    for delta in (yield TOKENS, block):
                        yield SEND, sse_message(delta)
                    block = min(max(end - clock(), 0.0), TOKEN_SLICE) if live == ON_WAKEUP else 0.0
                    woken = yield WAIT, block
                    if woken or clock() >= end:
                        break
            if woken or polls:
                break  # read


# -- a run's events -----------------------------------------------------------------------


def message(event: dict) -> str:
    return f"id: {event['seq']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


class ReadsSync(Protocol):
    """An event store's blocking reads, on a thread that may use the database (the
    database store's)."""

    @property
    def using(self) -> str: ...

    def read_sync(self, stream: str, *, after: int = 0, limit: int | None = None) -> Sequence[Event]: ...

    def head_sync(self, stream: str) -> tuple[int, str] | None: ...


@dataclass
class RunEvents:
    """A run's log as a :class:`Feed`: messages of ``shape(event)``, the cursor a seq."""

    store: ReadsSync
    run_id: str
    shape: Callable[[Event], dict]

    @property
    def key(self) -> str:
        return self.run_id

    @property
    def using(self) -> str:
        return str(self.store.using)

    def read(self, after: int) -> Page:
        events = self.store.read_sync(self.run_id, after=after, limit=PAGE)
        return Page(
            [(message(self.shape(e)), e.type == RUN_COMPLETED) for e in events],
            after=(events[-1].seq or after) if events else after,
            more=len(events) == PAGE,
        )

    def head(self) -> bool:
        return self.store.head_sync(self.run_id) is not None


def events(
    store: ReadsSync,
    run_id: str,
    after: int,
    *,
    shape: Callable[[Event], dict],
    max_seconds: float,
    ended: bool,
    slot: streamcap.Slot | None = None,
    wakeups: Wakeups | None = None,
    subscribe: Callable[[], TokenSubscription | None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[str]:
    """The SSE text of the run's events after ``after``, until the completion (or, for
    a run that had ``ended`` before the stream opened, until what is stored is sent),
    read on the calling thread (:func:`drive`). ``slot``: renewed while the stream
    runs, given back when it ends, however it ends. ``wakeups``: what wakes it
    (default: none; it polls). ``subscribe``: the run's live tokens, sent between its
    events."""
    wakeups = wakeups if wakeups is not None else Hub()  # (polls)
    steps = plan(
        after, ended=ended, max_seconds=max_seconds, renews=slot is not None, reliable=wakeups.reliable, clock=clock
    )
    return drive(steps, RunEvents(store, run_id, shape), wakeups=wakeups, slot=slot, subscribe=subscribe)


# -- the drivers ------------------------------------------------------------------------


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


def drive(
    steps: Steps,
    feed: Feed,
    *,
    wakeups: Wakeups,
    slot: streamcap.Slot | None = None,
    subscribe: Callable[[], TokenSubscription | None] | None = None,
) -> Iterator[str]:
    """Carry out a :func:`plan` over ``feed`` on the calling thread: the stream's text.
    It blocks where it waits: on the token feed while tokens come (their wake-up looked
    at between two waits), else on its wake-up. ``slot``: renewed while it runs, given
    back when it ends, however it ends; ``subscribe``: its live tokens."""
    idle = letting_go(feed.using, wakeups)
    sub: Subscription | None = None
    tokens: TokenSubscription | None = None
    try:
        reply: Any = None
        while True:
            try:
                op, arg = steps.send(reply)
            except StopIteration:
                return
            reply = None
            if op == SEND:
                yield arg
            elif op == OPEN:
                sub = wakeups.subscribe(feed.key)
                tokens = subscribe() if arg and subscribe is not None else None
                reply = None if tokens is None else ON_TOKENS
            elif op == READ:
                assert sub is not None
                sub.clear()
                reply = feed.read(arg)
            elif op == TOKENS:
                assert tokens is not None
                if arg:
                    idle()
                reply = tokens.wait(arg)
            elif op == HEAD:
                reply = feed.head()
            elif op == RENEW:
                assert slot is not None
                slot.renew()
            elif op == SLEEP:
                idle()
                time.sleep(arg)
            else:  # WAIT
                assert sub is not None
                idle()
                reply = sub.wait(arg)
    finally:
        if tokens is not None:
            tokens.close()
        if sub is not None:
            sub.close()
        if slot is not None:
            slot.release()


_readers: ThreadPoolExecutor | None = None


def _on_reader(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
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


async def adrive(
    steps: Steps,
    feed: Feed,
    *,
    wakeups: Wakeups,
    slot: streamcap.Slot | None = None,
    subscribe: Callable[[], TokenSubscription | None] | None = None,
) -> AsyncIterator[str]:
    """:func:`drive` for an ASGI server: waits on the event loop (no thread), always on
    its wake-up (the token feed is looked at without blocking, after each wait), and
    reads on the process's :data:`READERS` threads, letting go of their connection
    after each read as :func:`drive` does before each wait."""
    # The view ran on the request's thread, whose connection Django closes only when
    # the response ends: close it now (the view and middleware are done with it).
    await sync_to_async(_close_connections, thread_sensitive=True)()
    idle = letting_go(feed.using, wakeups)

    def read(after: Any) -> Page:
        try:
            return feed.read(after)
        finally:
            idle()

    def head() -> bool | None:
        try:
            return feed.head()
        finally:
            idle()

    sub: Subscription | None = None
    tokens: TokenSubscription | None = None
    try:
        reply: Any = None
        while True:
            try:
                op, arg = steps.send(reply)
            except StopIteration:
                return
            reply = None
            if op == SEND:
                yield arg
            elif op == OPEN:
                sub = wakeups.subscribe(feed.key, asyncio.get_running_loop())
                # (a Redis subscription waits for Redis to confirm it: on a reader thread)
                if arg and subscribe is not None:
                    tokens = await _on_reader(subscribe)()
                reply = None if tokens is None else ON_WAKEUP
            elif op == READ:
                assert sub is not None
                sub.clear()
                reply = await _on_reader(read)(arg)
            elif op == TOKENS:  # (never asked to block: the wake-up is where it waits)
                assert tokens is not None
                reply = tokens.wait(0)
            elif op == HEAD:
                reply = await _on_reader(head)()
            elif op == RENEW:
                assert slot is not None
                await _on_reader(slot.renew)()
            elif op == SLEEP:
                await asyncio.sleep(arg)
            else:  # WAIT
                assert sub is not None
                reply = await sub.until(arg)
    finally:
        if tokens is not None:
            await _on_reader(tokens.close)()
        if sub is not None:
            sub.close()
        if slot is not None:
            await _on_reader(slot.release)()


def sse_content(description: str, data: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI ``text/event-stream`` content whose schema describes one event (as
    OpenAPI before 3.2 reads it), ``data`` the JSON schema of its ``data``; or the
    stream's text, as a client that reads the whole body at once gets it."""
    event = {
        "type": "object",
        "description": "one event of the stream",
        "properties": {
            "id": {"type": "string"},
            "event": {"type": "string"},
            "retry": {"type": "integer"},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": data},
        },
        "required": ["data"],
    }
    return {
        "description": description,
        "content": {
            "text/event-stream": {"schema": {"anyOf": [event, {"type": "string", "description": "the stream's text"}]}}
        },
    }


def open_slot(request: HttpRequest, loc: list[str]) -> streamcap.Slot:
    """A place among the caller's open streams (``AAA["API_STREAMS_PER_USER"]``), or a
    429 :class:`~.errors.ApiError` when they hold every one."""
    limit = aaa_settings()["API_STREAMS_PER_USER"]
    slot = streamcap.acquire(request.auth.user.pk, limit)
    if slot is None:
        raise ApiError(
            429,
            loc,
            f"too many open streams: at most {limit} per user; close one",
            "too_many_streams",
            headers={"Retry-After": str(RETRY_MS // 1000)},
        )
    return slot


def respond(
    request: HttpRequest,
    steps: Steps,
    feed: Feed,
    *,
    wakeups: Wakeups,
    slot: streamcap.Slot | None,
    subscribe: Callable[[], TokenSubscription | None] | None = None,
) -> StreamingHttpResponse:
    """The streaming response of a plan over a feed, driven as the server needs: under
    ASGI the async iterator (a sync one would be read to its end by Django before
    anything is sent), under WSGI the request's thread."""
    body: Iterator[str] | AsyncIterator[str]
    if isinstance(request, ASGIRequest):
        body = adrive(steps, feed, wakeups=wakeups, slot=slot, subscribe=subscribe)
    else:
        body = drive(steps, feed, wakeups=wakeups, slot=slot, subscribe=subscribe)
    response = StreamingHttpResponse(body, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
