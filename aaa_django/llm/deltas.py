"""Live tokens: a model reply's text as it is written, outside the log.

A streaming model client hands each piece of text to the :class:`LLMHandler
<aaa_django.llm.handler.LLMHandler>`, which publishes it as a :class:`TokenDelta` to
its :class:`DeltaSink`. Deltas never enter the log: the complete reply stays the one
``aaa.llm.completed`` event, and a listener that misses deltas (it subscribed late,
or fell behind) still gets the whole reply from that event.

``index`` counts a reply's deltas from 0; a delta of index 0 after others of the same
request starts the reply over (a retried attempt): a listener drops what it had.

:class:`LocalTokens` is the in-process fan-out (the sink and the feed in one); the
site publishes through Redis across processes (``aaa_django.store.tokens``).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

#: deltas a subscriber keeps while it is not reading; older ones are dropped (the
#: reply's event carries the whole text anyway)
BACKLOG = 10_000


class TokenDeltaDict(TypedDict):
    """A :class:`TokenDelta` as JSON (what a token feed carries)."""

    run_id: str
    request_id: str
    index: int
    text: str


@dataclass(frozen=True)
class TokenDelta:
    """A piece of a model reply's text, as the provider sent it."""

    run_id: str
    #: the id of the ``aaa.llm.requested`` event the reply answers
    request_id: str
    #: the delta's place in its reply, from 0 (0 again: the reply starts over)
    index: int
    text: str

    def to_dict(self) -> TokenDeltaDict:
        return {"run_id": self.run_id, "request_id": self.request_id, "index": self.index, "text": self.text}

    @classmethod
    def from_dict(cls, data: Any) -> TokenDelta:
        """A delta from its dict; ``ValueError`` when ``data`` is not one."""
        try:
            delta = cls(run_id=data["run_id"], request_id=data["request_id"], index=data["index"], text=data["text"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a token delta: {str(data)[:200]!r}") from exc
        if not (
            isinstance(delta.run_id, str)
            and isinstance(delta.request_id, str)
            and isinstance(delta.index, int)
            and isinstance(delta.text, str)
        ):
            raise ValueError(f"not a token delta: {str(data)[:200]!r}")
        return delta


@runtime_checkable
class DeltaSink(Protocol):
    """Where a handler sends deltas. ``publish`` is called on the engine's loop for
    every delta: it must not block for long, and it never raises (a lost delta costs
    nothing; a raised one would fail the model call)."""

    def publish(self, delta: TokenDelta) -> None: ...


class TokenSubscription(Protocol):
    """One listener's deltas of one run, from the moment it subscribed."""

    def wait(self, timeout: float) -> list[TokenDelta]:
        """The deltas that came since the last call, waiting up to ``timeout``
        seconds for the first (``[]`` when none came)."""
        ...

    def close(self) -> None: ...


class TokenFeed(Protocol):
    """Where listeners subscribe to a run's deltas."""

    def subscribe(self, run_id: str) -> TokenSubscription: ...


class LocalSubscription:
    """A subscription to :class:`LocalTokens` (thread-safe: published on the engine's
    thread, read on the listener's)."""

    def __init__(self, owner: LocalTokens, run_id: str) -> None:
        self.owner = owner
        self.run_id = run_id
        self._queue: collections.deque[TokenDelta] = collections.deque(maxlen=BACKLOG)
        self._ready = threading.Condition()

    def put(self, delta: TokenDelta) -> None:
        with self._ready:
            self._queue.append(delta)
            self._ready.notify_all()

    def wait(self, timeout: float) -> list[TokenDelta]:
        with self._ready:
            if not self._queue and timeout > 0:
                self._ready.wait(timeout)
            out = list(self._queue)
            self._queue.clear()
        return out

    def close(self) -> None:
        self.owner._unsubscribe(self)

    def __enter__(self) -> LocalSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalTokens:
    """The in-process fan-out: a :class:`DeltaSink` and a :class:`TokenFeed`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, set[LocalSubscription]] = {}

    def publish(self, delta: TokenDelta) -> None:
        with self._lock:
            subs = list(self._subs.get(delta.run_id, ()))
        for sub in subs:
            sub.put(delta)

    def subscribe(self, run_id: str) -> LocalSubscription:
        sub = LocalSubscription(self, run_id)
        with self._lock:
            self._subs.setdefault(run_id, set()).add(sub)
        return sub

    def _unsubscribe(self, sub: LocalSubscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.run_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.run_id]
