"""The run page's live tokens: a model reply's text as it is written, for the staff
watching a run (``AAA["STREAM_TOKENS"]``).

The run page opens an ``EventSource`` on the run's ``tokens/`` URL (admin login, the
run page's permissions); the answer is Server-Sent Events, one ``event: token`` per
:class:`~aaa_django.llm.deltas.TokenDelta` (``data``: run_id, request_id, index,
text), from the moment it subscribed. A stream lasts :data:`SECONDS` at most, then
the browser reconnects (deltas sent meanwhile are missed: the reply's
``aaa.llm.completed`` in the log has the whole text, and the page shows it when its
row comes). Nothing here reads the log: which reply is complete, and when the run
has ended, the page learns from its own polling (``live/``).

Under WSGI a stream blocks its request's thread on the feed; under ASGI it holds no
thread and looks at the feed every :data:`SLICE` seconds (Django would read a
synchronous iterator to its end before sending any of it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator

from aaa_django.llm.deltas import TokenSubscription
from aaa_django.site.tokens import sse_message

#: seconds one stream lasts before the browser reconnects
SECONDS = 30.0
#: seconds without a delta after which a comment keeps the connection open (and a
#: WSGI stream learns that its client has gone)
HEARTBEAT = 5.0
#: seconds between two looks at the feed of a stream served by ASGI
SLICE = 0.1
#: the browser's reconnection delay, in milliseconds
RETRY_MS = 1000


class _Stream:
    """One subscription's deltas as SSE text for up to ``seconds``; closing it (Django
    closes a response's content) closes the subscription, whether or not it was read."""

    def __init__(
        self, subscription: TokenSubscription, *, seconds: float = SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.subscription = subscription
        self.seconds = seconds
        self.clock = clock

    def close(self) -> None:
        self.subscription.close()


class TokenStream(_Stream):
    """For a WSGI server: blocks on the feed, up to :data:`HEARTBEAT` at a time."""

    def __iter__(self) -> Iterator[str]:
        stop = self.clock() + self.seconds
        yield f"retry: {RETRY_MS}\n\n"
        while (left := stop - self.clock()) > 0:
            deltas = self.subscription.wait(min(left, HEARTBEAT))
            for delta in deltas:
                yield sse_message(delta)
            if not deltas:
                yield ": keep-alive\n\n"


class AsyncTokenStream(_Stream):
    """For an ASGI server: looks at the feed every :data:`SLICE` seconds, without
    blocking (an async iterator only: Django serves what it can ``iter()`` as a
    synchronous stream)."""

    async def __aiter__(self) -> AsyncIterator[str]:
        start = last = self.clock()
        yield f"retry: {RETRY_MS}\n\n"
        while (now := self.clock()) < start + self.seconds:
            deltas = self.subscription.wait(0)
            for delta in deltas:
                yield sse_message(delta)
            if deltas:
                last = now
            elif now - last >= HEARTBEAT:
                last = now
                yield ": keep-alive\n\n"
            await asyncio.sleep(SLICE)
