"""Turns: which of a process's deliveries run now, the oldest work first.

An engine's deliveries share one event loop. Left to the loop, a hundred runs whose
model calls return together advance one hop each in turn (a step, its append, the
next step...), so each of them reaches its next model call only once all of them
have done their work: every run pays for every other's, and a run's wall time is
the sum of every turn's whole burst. :class:`Turns` lets ``width`` deliveries run at
once and queues the others by their *stamp* (where their run's work would be on its
timeline had the engine taken no time: below): the run most behind gets through its
turn (the step, the tool, the next request) first, while the database commits of the
``width`` deliveries running still share their transactions (group commit). The work
is the same; who waits for it is not: runs end spread over the burst instead of all
at its end.

- A delivery takes a turn (:meth:`Turns.turn`, the engine's ``handle`` and a worker's
  delivery) and keeps it while it works. The events it appends are delivered with its
  stamp (their delivery tasks inherit the context: see :func:`for_delivery`): a run's
  turn goes on before newer work.
- A wait on something outside (a model, a tool, a pool) is wrapped in
  :meth:`Turns.waiting`: the turn is given to the next delivery meanwhile, and the
  work after the wait keeps its stamp moved on by the time the wait took: a run's
  stamp is where its work would be had the engine taken no time at all (its ideal
  timeline), and the run furthest behind its own goes first. A tool that answers at
  once does not send its run to the back of the line.
- A delivery that keeps its turn longer than ``hold`` seconds (a handler that awaits
  something slow without :meth:`~Turns.waiting`) gives it up then, and goes on without
  one: a turn only orders work, it never stops it, so no wait can hold up the others
  for longer than ``hold``, and none can deadlock on them.

One loop's: the turns of an engine are used on the loop its deliveries run on.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import time
from collections.abc import Callable

__all__ = ["HOLD", "WIDTH", "Turns", "for_delivery"]

#: deliveries running at once: enough for the CPU to have work while commits wait
#: (a delivery is ~0.5 ms of CPU, a durable commit 0.4-2 ms) and for group commits to
#: fill; few enough that the oldest work is done first (benchmarks/bench_concurrency.py --width)
WIDTH = 16
#: seconds a delivery keeps its turn at most (see the module)
HOLD = 0.1

#: where this context's work is on its run's ideal timeline (the turns' clock: a new
#: run's is the moment its first delivery asks for a turn; None: not yet stamped)
_stamp: contextvars.ContextVar[float | None] = contextvars.ContextVar("aaa_turn_stamp", default=None)
#: the turn this context's delivery has taken, if any
_turn: contextvars.ContextVar[_Turn | None] = contextvars.ContextVar("aaa_turn", default=None)


def for_delivery(context: contextvars.Context | None = None) -> contextvars.Context:
    """A context for a new delivery task started from the current one: a copy of it
    (or ``context``, with the current stamp carried into it) without the current
    delivery's turn. The new delivery queues with the stamp of the work that caused it."""
    stamp = _stamp.get()
    ctx = contextvars.copy_context() if context is None else context
    ctx.run(_fresh, stamp)
    return ctx


def _fresh(stamp: float | None) -> None:
    _turn.set(None)
    _stamp.set(stamp)


class Turns:
    """The turns of one engine's deliveries (see the module): ``width`` at once;
    ``clock``: what stamps work (``time.monotonic``; a test's own clock orders it)."""

    def __init__(self, width: int = WIDTH, *, hold: float = HOLD, clock: Callable[[], float] = time.monotonic) -> None:
        if width < 1:
            raise ValueError("width must be at least 1")
        self.width = width
        self.hold = hold
        self.clock = clock
        self._free = width
        #: (stamp, order, future) of the deliveries waiting for a turn, oldest first
        self._queue: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()
        #: turns taken after waiting in the queue, and turns given up after ``hold``
        #: (tests, benchmarks)
        self.queued = 0
        self.forfeited = 0
        #: the turns held now -> when they were taken (``time.monotonic``)
        self._held: dict[_Turn, float] = {}
        #: waits on something outside (``waiting``) open now
        self.waits = 0
        #: the check of the turns held too long, while any is held (one timer for all:
        #: not one per delivery)
        self._check: asyncio.TimerHandle | None = None

    @property
    def running(self) -> int:
        """Turns held now."""
        return self.width - self._free

    @property
    def waiting_now(self) -> int:
        return sum(1 for *_, f in self._queue if not f.done())

    def alone(self) -> bool:
        """Is the current context's delivery all these turns have going: its turn the
        one held, none queued, no wait open (a model or a tool whose answer would
        want the loop)? The engine's own count, not a guess from timing."""
        turn = _turn.get()
        return (
            turn is not None
            and turn.turns is self
            and turn.held
            and self._free == self.width - 1
            and self.waits == 0
            and not any(not f.done() for *_, f in self._queue)
        )

    def turn(self) -> _Turn:
        """``async with``: a delivery's turn (inside one already: nothing more)."""
        return _Turn(self)

    def waiting(self) -> _Waiting:
        """``async with``: a wait on something outside; the delivery's turn goes to
        the next one meanwhile (outside a delivery: nothing to give)."""
        return _Waiting(self)

    async def _take(self, stamp: float) -> None:
        if self._free and not self._queue:
            self._free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (stamp, next(self._order), future))
        self.queued += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._give()  # given to us as we were cancelled: to the next one
            raise

    def _hold(self, turn: _Turn) -> None:
        turn.held = True
        self._held[turn] = time.monotonic()
        if self._check is None:
            self._check = asyncio.get_running_loop().call_later(self.hold, self._forfeit_old)

    def _drop(self, turn: _Turn) -> None:
        if turn.held:
            turn.held = False
            del self._held[turn]
            self._give()

    def _forfeit_old(self) -> None:
        self._check = None
        limit = time.monotonic() - self.hold
        for turn, taken in list(self._held.items()):
            if taken <= limit:
                self.forfeited += 1
                self._drop(turn)
        if self._held:
            oldest = min(self._held.values())
            self._check = asyncio.get_running_loop().call_later(
                max(oldest + self.hold - time.monotonic(), 0.0), self._forfeit_old
            )

    def _give(self) -> None:
        if self._queue:
            # Given on the loop's next turn, not now: the deliveries the one ending has
            # just started (its appends' deliveries, with its stamp) queue first, and
            # the turn goes to the oldest work among them all.
            asyncio.get_running_loop().call_soon(self._grant)
        else:
            self._free += 1

    def _grant(self) -> None:
        queue = self._queue
        while queue:
            future = heapq.heappop(queue)[2]
            if not future.done():  # (a waiter cancelled meanwhile is skipped)
                future.set_result(None)
                return
        self._free += 1


class _Turn:
    """A delivery's turn (``Turns.turn``); a class, not a generator: one per delivery."""

    __slots__ = ("turns", "held", "token", "outer")

    def __init__(self, turns: Turns) -> None:
        self.turns = turns
        self.held = False
        self.token: contextvars.Token | None = None
        self.outer = False

    async def __aenter__(self) -> None:
        if _turn.get() is not None:
            self.outer = True  # within a delivery's turn already
            return
        turns = self.turns
        stamp = _stamp.get()
        if stamp is None:
            stamp = turns.clock()
            _stamp.set(stamp)
        await turns._take(stamp)
        self.token = _turn.set(self)
        turns._hold(self)

    async def __aexit__(self, *exc: object) -> None:
        if self.outer:
            return
        if self.token is not None:
            _turn.reset(self.token)
        self.turns._drop(self)


class _Waiting:
    __slots__ = ("turns", "given", "began")

    def __init__(self, turns: Turns) -> None:
        self.turns = turns
        self.given: _Turn | None = None
        self.began = 0.0

    async def __aenter__(self) -> None:
        self.began = self.turns.clock()
        self.turns.waits += 1
        turn = _turn.get()
        if turn is not None and turn.turns is self.turns and turn.held:
            self.turns._drop(turn)
            self.given = turn

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.turns.waits -= 1
        waited = self.turns.clock() - self.began
        stamp = _stamp.get()
        # The work's place in line moves on by the time it waited, not to now: a run
        # keeps the place its ideal timeline gives it (a tool that answered at once
        # cost it nothing), so the run furthest behind its own goes first.
        stamp = (self.began if stamp is None else stamp) + waited
        _stamp.set(stamp)
        turn = self.given
        if turn is None or turn.held or exc_type is asyncio.CancelledError:
            return
        if _turn.get() is not turn:
            return  # the delivery's turn has ended meanwhile (a wait that outlived it)
        await self.turns._take(stamp)
        self.turns._hold(turn)
