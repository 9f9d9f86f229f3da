"""Group commit: appends of several runs that arrive together share one transaction
and one durable commit (:class:`GroupCommit`, used by
:class:`~aaa_django.store.postgres.PgEventStore`).

Each event loop has a few *lanes* (transactions in flight at once). An append that
finds a lane free holds it for one turn of the loop, and if no other append came
meanwhile, it is made at once, alone (its statements in autocommit, as an append alone
always is), in its caller's task; a caller whose loop has nothing else to do
(``caller_alone``, the engine's hint for a run alone) holds no turn when no other
append is on its way. Appends that arrive at the same moment, or while
every lane is busy, go together, in the next free lane: one transaction, and in it each append's own statements (the
same as alone: the same ordering checks, ``expected_seq``, idempotent ids, the run's
index row, the triggers), pipelined: the first statement of every append of the group
in one round trip, then the next of those that need another (an append without a
hint of its stream's head asks first), and one ``COMMIT``. Nothing waits for company
longer than that turn of the loop: a group is what queued meanwhile, or while the
lanes were busy. A group holds one append per stream
(a stream's next append starts from the head the one before it leaves: it goes in the
next group) and takes them in stream order, so two groups never wait on each other's
rows in opposite orders.

One append's refusal never fails the others: an append whose own checks refuse it
(``ConcurrencyError``) sends nothing, and after the commit it is made again alone,
which answers it as an append alone always has. A statement the database refuses (a
lost race: another process appended to the stream) rolls the transaction back, and
every append of the group is made again alone; so does a group that fails as a whole
(the connection lost, even at ``COMMIT``): event ids are idempotent, so an append the
lost commit did store is absorbed.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aaa_django.events import Event
from aaa_django.events.store import caller_alone

from .appends import CATCH_UP, QUERY, Steps
from .connections import PgConnections
from .rows import prepares

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg.rows import TupleRow

#: transactions in flight at once per event loop (of the 10 connections a loop may use: the
#: other two serve reads and snapshots meanwhile)
LANES = 8
#: appends in one transaction at most (each holds a subtransaction until the commit;
#: PostgreSQL caches 64 per backend)
MAX_GROUP = 32


@dataclass
class _Append:
    stream: str
    batch: list[Event]
    texts: list[str]
    expected_seq: int | None
    future: asyncio.Future
    stored: list[Event] | None = None
    catch_up: list[list[Event]] = field(default_factory=list)


class _Loop:
    """What one event loop's appends share: the queue and the lanes in use."""

    def __init__(self) -> None:
        self.queue: list[_Append] = []
        self.busy = 0
        self.tasks: set[asyncio.Task] = set()


class GroupedStore(Protocol):
    """What a group commit needs of its store
    (:class:`~aaa_django.store.postgres.PgEventStore`)."""

    @property
    def conns(self) -> PgConnections: ...

    def _steps(
        self, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None, *, prepares: bool
    ) -> Steps: ...

    async def _append_statement(
        self, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None
    ) -> list[Event] | None: ...

    async def _catch_up(self, stored: list[Event]) -> None: ...


class GroupCommit:
    """The group commit of one store's appends (see the module)."""

    def __init__(self, store: GroupedStore, *, lanes: int = LANES, max_group: int = MAX_GROUP) -> None:
        self.store = store
        self.lanes = lanes
        self.max_group = max_group
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Loop] = weakref.WeakKeyDictionary()
        #: groups committed, the appends they held, and groups rolled back (their
        #: appends made again alone) (benchmarks, tests)
        self.groups = 0
        self.grouped = 0
        self.rolled_back = 0

    async def append(
        self, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None
    ) -> list[Event] | None:
        """The stored events, or None: not the common case (nothing written; the
        caller takes the general path)."""
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _Loop()
        item = _Append(stream, batch, texts, expected_seq, loop.create_future())
        state.queue.append(item)
        if state.busy >= self.lanes:
            return await item.future  # a lane takes it when one is free
        if len(state.queue) == 1:
            # First in, a lane free: hold it one turn of the loop, for the appends
            # started at the same moment to queue; still alone, made here, in the
            # caller's task, as a lane would make it (without a lane's task); else the
            # appends go together, by a lane. No turn is held for a caller that says its
            # loop has nothing else to do (``caller_alone``: the engine, for a run alone)
            # while no other append is on its way: no company is coming.
            hold = state.busy > 0 or not caller_alone.get()
            state.busy += 1
            try:
                if hold:
                    await asyncio.sleep(0)
                if len(state.queue) == 1 and state.queue[0] is item:
                    state.queue = []
                    return await self.store._append_statement(stream, batch, texts, expected_seq)
            except BaseException:
                item.future.cancel()  # (a lane that takes it skips it)
                raise
            finally:
                state.busy -= 1
                if state.busy < self.lanes and any(not i.future.done() for i in state.queue):
                    self._start_lane(loop, state)
            return await item.future  # taken by a lane meanwhile, or queued for one
        self._start_lane(loop, state)
        return await item.future

    def _start_lane(self, loop: asyncio.AbstractEventLoop, state: _Loop) -> None:
        state.busy += 1
        task = loop.create_task(self._lane(state))
        state.tasks.add(task)
        task.add_done_callback(state.tasks.discard)

    async def _lane(self, state: _Loop) -> None:
        group: list[_Append] = []
        try:
            while state.queue:
                group, state.queue = _take(state.queue, self.max_group)
                if len(group) == 1:
                    await self._alone(group[0])
                elif group:
                    await self._together(group)
        except BaseException as exc:  # cancelled (the loop ends): no append left waiting
            left = group + (state.queue if state.busy == 1 else [])
            for item in left:
                _settle(item, exc=exc)
            raise
        finally:
            state.busy -= 1

    async def _alone(self, item: _Append) -> None:
        try:
            stored = await self.store._append_statement(item.stream, item.batch, item.texts, item.expected_seq)
        except Exception as exc:
            _settle(item, exc=exc)
            return
        _settle(item, stored)

    async def _rounds(self, conn: AsyncConnection[TupleRow], group: list[_Append], steps: dict[int, Steps]) -> None:
        """The group's transaction on ``conn``, in rounds: each round, the next
        statement of every append still going, pipelined (one round trip for them
        all), their results back to their steps. ``BEGIN`` goes with the first round,
        ``COMMIT`` with the round after which no append has another statement (one
        whose next statement is its last: an insert; the query of an append without a
        hint has one after it): the common case is one round trip for the group. When
        a round that was not known to be the last turns out to be (every append that
        asked ended after its query: absorbed, or refused by its own checks), the
        ``COMMIT`` goes alone, one more round trip."""
        now = {id(item): _advance(item, steps[id(item)], None) for item in group}
        began = False
        try:
            while any(step is not None for step in now.values()):
                last = all(step is None or step[0] is not QUERY for step in now.values())
                cursors = {}
                refused: Exception | None = None
                async with conn.pipeline():
                    # A statement refused in the pipeline surfaces in a later execute;
                    # kept until the pipeline is left (which raises it too), so that
                    # psycopg does not log "error ignored terminating" the pipeline.
                    try:
                        if not began:
                            await conn.execute("BEGIN", prepare=False)
                            began = True
                        for key, step in now.items():
                            if step is not None:
                                cur = cursors[key] = conn.cursor()
                                await cur.execute(*step)
                        if last:
                            await conn.execute("COMMIT", prepare=False)
                            began = False
                    except Exception as exc:
                        refused = exc
                if refused is not None:
                    raise refused
                nxt = {}
                for item in group:
                    done = cursors.get(id(item))
                    if done is not None:
                        result = (done.rowcount, await done.fetchone() if done.description else None)
                        nxt[id(item)] = _advance(item, steps[id(item)], result)
                if last and any(step is not None for step in nxt.values()):
                    # (an insert is an append's last statement: never, but then alone)
                    for item in group:
                        if nxt.get(id(item)) is not None:
                            item.stored = None
                    return
                now = nxt
            if began:
                # The round's statements were the last after all: the appends that
                # asked first ended after their query (absorbed, or refused by their
                # own checks), so no round carried the COMMIT. Commit what the others
                # wrote (without this they would be rolled back, yet reported stored).
                await conn.execute("COMMIT", prepare=False)
                began = False
        finally:
            from psycopg.pq import TransactionStatus

            if began or conn.info.transaction_status != TransactionStatus.IDLE:
                await conn.execute("ROLLBACK", prepare=False)  # refused, or cut short: nothing stored

    async def _together(self, group: list[_Append]) -> None:
        store = self.store
        group.sort(key=lambda item: item.stream)
        steps: dict[int, Steps] = {}
        try:
            # (pipelined: after a refusal the connection is not used again, see
            # PgConnections.connection)
            async with store.conns.connection(pipelined=True) as conn:
                on = prepares(conn)  # (which statements the steps send)
                steps.update(
                    (id(item), store._steps(item.stream, item.batch, item.texts, item.expected_seq, prepares=on))
                    for item in group
                )
                await self._rounds(conn, group, steps)
        except Exception:
            # A statement refused (the transaction is rolled back whole), or the
            # transaction failed as a whole (perhaps at COMMIT: stored or not): each
            # append again, alone (ids are idempotent).
            self.rolled_back += 1
            for item in group:
                item.stored = None
                item.catch_up.clear()
        else:
            self.groups += 1
            self.grouped += len(group)
        finally:
            for gen in steps.values():
                gen.close()
        for item in group:
            if item.future.done():
                continue
            if item.stored is None:
                await self._alone(item)
                continue
            try:
                for stored in item.catch_up:  # rare: a run's row moved meanwhile
                    await store._catch_up(stored)
            except Exception as exc:
                _settle(item, exc=exc)
                continue
            _settle(item, item.stored)


def _advance(item: _Append, steps: Steps, result: object) -> tuple[Any, Any] | None:
    """Send ``result`` (None: start) to an append's steps; its next statement, or None
    when it is done (``item.stored``: its events, or None: made again alone)."""
    try:
        step = next(steps) if result is None else steps.send(result)
        while step[0] is CATCH_UP:  # after the commit
            item.catch_up.append(step[1])
            step = steps.send(None)
        return step
    except StopIteration as done:
        item.stored = done.value
    except Exception:  # e.g. ConcurrencyError: alone, it answers as always
        item.stored = None
    return None


def _take(queue: list[_Append], most: int) -> tuple[list[_Append], list[_Append]]:
    """A group from ``queue`` (at most ``most``, one append per stream: a stream's next
    append starts from the head the one before leaves), and what stays queued."""
    group: list[_Append] = []
    left: list[_Append] = []
    streams: set[str] = set()
    for item in queue:
        if item.future.done():  # its caller is gone
            continue
        if len(group) < most and item.stream not in streams:
            group.append(item)
            streams.add(item.stream)
        else:
            left.append(item)
    return group, left


def _settle(item: _Append, stored: list[Event] | None = None, *, exc: BaseException | None = None) -> None:
    if item.future.done():
        return
    if exc is not None:
        item.future.set_exception(exc)
    else:
        item.future.set_result(stored)
