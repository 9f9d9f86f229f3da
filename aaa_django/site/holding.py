"""A process's hold on the runs it drives: leases in the run index, a heartbeat, adoption.

Every process that drives runs (the web process's engine host on the in-process bus,
each Celery worker process, ``manage.py aaa_sweep``) has one :class:`RunKeeper` per
database. It is a *holder*: an id of its own (:func:`holder_id`: the machine, the pid
namespace, the pid and the process's start time), written into the run index row of
each run it drives (``aaa_run.held_by``, :mod:`aaa_django.store.leases`) with the
time its lease lapses (``held_until``, ``AAA["RUN_LEASE_TTL"]`` seconds on).

- **Claim.** A process claims a run before it works on it: the engine host when it
  appends a run's first event (or any event of a run it does not hold), a worker when
  a delivery of a run it does not hold begins. Claims that come at once share one
  statement; a run the process holds already costs nothing.
- **Heartbeat.** Every quarter of the lease, one write renews every lease the
  process has (:meth:`RunKeeper.beat`: its own row, whatever the number of runs); the
  runs it still holds are read with it.
- **Stand down.** A process whose last renewal began half a lease ago or more (its
  database is out of reach, the network is cut) stands down: :meth:`RunKeeper.holds`
  says False for every run, so its handlers make no model or tool call (the
  :class:`~aaa_django.runtime.holding.HoldsRuns` question). Its leases can lapse only
  later, at a full lease: no other process can have adopted a run while this one may
  still call out for it. When a renewal succeeds again, the runs it no longer holds
  (adopted meanwhile) are *fenced*: this process does not call out for them again,
  nor deliver their events on its own (a late result it appends goes to whoever
  drives the run now); the runs it still holds are driven again (``on_regained``):
  a call it skipped while it stood down is made.
- **Nothing declined is dropped.** Every run :meth:`RunKeeper.holds` said no for is
  driven again after the next renewal too (``on_regained``), held or not: a run can
  leave a process for reasons other than adoption (a Celery worker's prefork children
  each claim the runs whose messages they take, so a run moves between them with
  every delivery), and its holder now was handed other work than the call this process
  skipped. A worker's re-drive of a fenced run goes to the broker, to whoever takes
  it; a process without a broker re-drives only the runs not fenced.
- **Adopt.** :meth:`RunKeeper.adopt` takes the unfinished runs whose lease has lapsed,
  and those of holders on this machine that are known to be dead (their pid is gone,
  or is another process now: a restarted web server or worker adopts its
  predecessor's runs at once), each by a conditional ``UPDATE``, so several
  processes adopting at once take each run once. The caller re-drives what it took
  (``Engine.resume``). A keeper adopts only the runs of its *fleet*: the processes
  that can drive each other's runs. On the Celery bus that is the processes that
  deliver on the same queues (``AAA["CELERY_QUEUES"]``: :func:`fleet`); two sites, or
  two deployments, that share a database but not their queues (and so perhaps not
  their agents and tools) never take each other's runs.

Statements run on one thread of the keeper's own, on a connection of its own (with
keepalives and timeouts on PostgreSQL); the loop never waits on one longer than half
a lease.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from aaa_django.conf import aaa_settings
from aaa_django.events import Event, StoreUnavailable
from aaa_django.runtime.event_types import RUN_COMPLETED
from aaa_django.runtime.holding import holder_id, process_gone
from aaa_django.store.leases import RunLeases

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("aaa_django.holding")

#: fenced runs remembered (the oldest forgotten first)
FENCED_KEPT = 10_000


@dataclass
class Beat:
    """What one renewal found."""

    #: the runs held after it
    held: set[str] = field(default_factory=set)
    #: runs held before that another process took while this one stood down
    fenced: set[str] = field(default_factory=set)
    #: runs held across a stand-down, still this process's: to drive again
    regained: set[str] = field(default_factory=set)
    #: runs ``holds`` said no for since the renewal before: a call skipped, to drive again
    declined: set[str] = field(default_factory=set)
    #: the renewal failed (or timed out)
    failed: bool = False


def fleet() -> str:
    """This process's fleet, from the settings: on the Celery bus with
    ``AAA["CELERY_QUEUES"]`` named, a digest of the queues; else ``""`` (every process
    of the database's site)."""
    options = aaa_settings()
    queues = options["CELERY_QUEUES"] if options["BUS"] == "celery" else None
    if not queues:
        return ""
    return hashlib.sha256(json.dumps(queues, sort_keys=True).encode()).hexdigest()[:12]


site_fleet = fleet  # (RunKeeper's argument has the name)


def fleet_of(holder: str) -> str:
    """The fleet of a holder id (``""``: none)."""
    return holder.split("|", 1)[0].partition("@")[2]


class RunKeeper:
    """This process's leases on the runs it drives in database ``using`` (see the
    module). ``ttl``: seconds a lease lives unless renewed (``AAA["RUN_LEASE_TTL"]``);
    ``name``: the first part of the holder id (what kind of process: ``web``,
    ``worker``, ``sweep``); ``fleet``: the processes whose runs it adopts (default:
    :func:`fleet`)."""

    def __init__(
        self, using: str = "default", *, ttl: float | None = None, name: str = "", fleet: str | None = None
    ) -> None:
        self.using = using
        self.ttl = float(ttl if ttl is not None else aaa_settings()["RUN_LEASE_TTL"])
        self.fleet = site_fleet() if fleet is None else fleet
        self.id = holder_id(f"{name or 'aaa'}@{self.fleet}" if self.fleet else name)
        self.leases = RunLeases(using)
        #: the keeper's thread: its statements, on its connection
        self._db = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aaa-leases")
        #: runs held (as of the last renewal, and claimed since)
        self.held: set[str] = set()
        #: runs taken from this process while it stood down: not called out for again
        self.fenced: OrderedDict[str, None] = OrderedDict()
        #: runs :meth:`holds` said no for since the last renewal (their callers skipped
        #: work): driven again after the next one
        self._declined: OrderedDict[str, None] = OrderedDict()
        #: (monotonic) start of the last renewal that succeeded; None: none yet
        self.renewed: float | None = None
        #: run -> (monotonic) start of its claim, since the last renewal
        self._claimed: dict[str, float] = {}
        #: claims waiting for the next statement: run id -> (force, its waiters)
        self._pending: dict[str, tuple[bool, list[asyncio.Future]]] = {}
        self._flushing: asyncio.Task | None = None
        #: the statement running on the keeper's thread now (one at a time)
        self._busy: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._down = False
        #: renewals made, failed; runs adopted
        self.beats = 0
        self.failures = 0
        self.adopted = 0

    def __repr__(self) -> str:
        return f"RunKeeper({self.using!r}, {self.id!r})"

    @property
    def every(self) -> float:
        """Seconds between two renewals: a quarter of the lease."""
        return self.ttl / 4

    # -- the question a handler asks ------------------------------------------------------------

    def holds(self, run_id: str) -> bool:
        """May this process call out for ``run_id`` now (see the module)? Not for a
        fenced run, nor for any once its leases were last renewed (or this run's
        claimed) half a lease ago or more. A run it says no for is driven again after
        the next renewal (see the module: nothing declined is dropped)."""
        if run_id not in self.fenced:
            since = self._claimed.get(run_id, self.renewed)
            if since is not None and time.monotonic() - since < self.ttl / 2:
                return True
        self._declined[run_id] = None
        while len(self._declined) > FENCED_KEPT:
            self._declined.popitem(last=False)
        return False

    def standing_down(self) -> bool:
        """Has this process stood down (no renewal for half a lease)?"""
        return self.renewed is None or time.monotonic() - self.renewed >= self.ttl / 2

    # -- statements on the keeper's thread ------------------------------------------------------

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args)`` on the keeper's thread, one statement at a time; waited for up
        to half a lease (past that, whatever it does, this process has stood down:
        the statement goes on, and the next call waits for it)."""
        loop = asyncio.get_running_loop()
        limit = self.ttl / 2
        if self._busy is not None and not self._busy.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._busy), limit)
            except TimeoutError:
                raise StoreUnavailable(
                    "the run leases' connection is still waiting for the database", service="database"
                ) from None
            except Exception:
                pass  # (that statement's failure was its caller's)
        future = loop.run_in_executor(self._db, lambda: fn(*args, **kwargs))
        self._busy = future
        try:
            return await asyncio.wait_for(asyncio.shield(future), limit)
        except TimeoutError:
            raise StoreUnavailable(
                f"the run leases' statement took longer than {limit:g} s", service="database"
            ) from None

    # -- claims ---------------------------------------------------------------------------------

    async def claim(self, run_id: str, *, force: bool = True) -> bool:
        """Hold ``run_id`` (see :meth:`RunLeases.claim`; ``force``: whoever holds it
        now); True if this process holds it after. A run held already (as of the last
        renewal or claim), and not fenced, costs nothing. Claims made at once share a
        statement. Raises what the statement raised (the database is out of reach)."""
        if run_id in self.held and run_id not in self.fenced:
            return True  # (recorded already: whether it may call out is holds()'s to say)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future = loop.create_future()
        entry = self._pending.get(run_id)
        if entry is None:
            self._pending[run_id] = (force, [waiter])
        else:
            self._pending[run_id] = (entry[0] or force, [*entry[1], waiter])
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._flush())
        return await waiter

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            started = time.monotonic()
            got: set[str] = set()
            try:
                for force in (True, False):
                    ids = [r for r, (f, _) in batch.items() if f is force]
                    if ids:
                        got |= await self._call(self.leases.claim, self.id, ids, self.ttl, force=force)
            except BaseException as exc:
                for _, waiters in batch.values():
                    for w in waiters:
                        if not w.done():
                            w.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for run_id, (_, waiters) in batch.items():
                if run_id in got:
                    self.held.add(run_id)
                    self._claimed[run_id] = started
                    self.fenced.pop(run_id, None)
                for w in waiters:
                    if not w.done():
                        w.set_result(run_id in got)

    # -- the heartbeat --------------------------------------------------------------------------

    async def beat(self) -> Beat:
        """Renew every lease this process has (one write); see :class:`Beat`."""
        started = time.monotonic()
        before, previous = set(self.held), self.renewed
        try:
            held = await self._call(self.leases.renew, self.id, self.ttl)
        except Exception as exc:
            self.failures += 1
            if self.standing_down() and not self._down:
                self._down = True
                log.warning(
                    "%s stands down: its leases were last renewed %s ago (%s: %s); no model or "
                    "tool call for its %d runs until it renews them",
                    self.id,
                    _ago(previous),
                    type(exc).__name__,
                    exc,
                    len(before),
                )
            return Beat(held=set(self.held), failed=True)
        done = time.monotonic()
        self.beats += 1
        beat = Beat(held=set(held))
        # Could a lease have lapsed (and been adopted) since the last renewal began?
        lapsed = previous is not None and done - previous >= self.ttl
        was_down = self._down or (previous is not None and started - previous >= self.ttl / 2)
        claimed_since = {r for r, at in self._claimed.items() if at >= started}
        if lapsed:
            beat.fenced = before - held - claimed_since
            for run_id in beat.fenced:
                self.fenced[run_id] = None
            while len(self.fenced) > FENCED_KEPT:
                self.fenced.popitem(last=False)
        if was_down:
            beat.regained = before & held
        beat.declined = set(self._declined)
        self._declined.clear()
        self.held = held | claimed_since
        self._claimed = {r: at for r, at in self._claimed.items() if at >= started}
        self.renewed = started
        if self._down or beat.fenced:
            log.warning(
                "%s renews its leases again: %d runs held, %d taken by other processes meanwhile "
                "(not driven here again)",
                self.id,
                len(held),
                len(beat.fenced),
            )
        self._down = False
        return beat

    def start(self, on_regained: Callable[[set[str]], Awaitable[object]] | None = None) -> asyncio.Task:
        """Start the heartbeat on the running loop (every :attr:`every` seconds; the
        first now). ``on_regained(runs)``: drive again the runs held across a stand-down
        and those :meth:`holds` said no for since the renewal before (``Beat.regained``
        and ``Beat.declined``)."""
        self._stopping = False
        self._task = asyncio.ensure_future(self._heartbeat(on_regained))
        return self._task

    async def _heartbeat(self, on_regained: Callable[[set[str]], Awaitable[object]] | None) -> None:
        clock = asyncio.get_running_loop().time
        while not self._stopping:
            began = clock()
            beat = await self.beat()
            again = beat.regained | beat.declined
            if again and on_regained is not None:
                try:
                    await on_regained(again)
                except Exception:
                    log.exception("driving again the runs %s held across a stand-down failed", self.id)
            await asyncio.sleep(max(0.0, self.every - (clock() - began)))

    async def stop(self, *, release: bool = False) -> None:
        """Stop the heartbeat; ``release``: let this process's leases lapse now (an
        orderly shutdown with runs in hand: another process adopts them at once)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        if release:
            try:
                released = await self._call(self.leases.release, self.id)
                if released:
                    log.info("%s released its leases of %d runs", self.id, len(released))
            except Exception:
                log.warning("%s could not release its leases (they lapse by themselves)", self.id, exc_info=True)
            self.held.clear()

    def close(self) -> None:
        """Close the keeper's connection and thread (after :meth:`stop`)."""
        try:
            self._db.submit(self.leases.close).result(10)
        except Exception:
            pass
        self._db.shutdown(wait=False)

    # -- adopting --------------------------------------------------------------------------------

    async def adopt(self, *, limit: int = 1000) -> set[str]:
        """Take the unfinished runs whose holder is gone: known dead on this machine, or
        whose lease has lapsed (at most ``limit`` of those). Returns the runs taken
        (each adopted by one process however many try): re-drive them."""
        started = time.monotonic()
        taken: set[str] = set()
        for holder in await self._call(self.leases.holders):
            if holder != self.id and fleet_of(holder) == self.fleet and process_gone(holder):
                got = await self._call(self.leases.adopt, self.id, holder, None, self.ttl, lapsed=False)
                if got:
                    log.info("%s adopts %d runs of %s, which has ended", self.id, len(got), holder)
                taken |= got
        by_holder: dict[str, list[str]] = {}
        for run_id, holder in await self._call(self.leases.lapsed, limit, fleet=self.fleet):
            by_holder.setdefault(holder, []).append(run_id)
        for holder, runs in by_holder.items():
            if holder == self.id:
                # (its own, lapsed while it stood down: the heartbeat takes them up)
                continue
            got = await self._call(self.leases.adopt, self.id, holder, runs, self.ttl)
            if got:
                log.info("%s adopts %d runs whose lease %s let lapse", self.id, len(got), holder)
            taken |= got
        self._took(taken, started)
        return taken

    async def adopt_unheld(self, stall_after: float, *, limit: int = 1000) -> set[str]:
        """Take the unfinished runs no process holds that have been idle for
        ``stall_after`` seconds (started by an engine without a keeper, or before
        leases were kept); the runs taken, to re-drive."""
        started = time.monotonic()
        since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=stall_after)
        idle = await self._call(self.leases.unheld, since, limit)
        taken: set[str] = await self._call(self.leases.adopt, self.id, None, idle, self.ttl) if idle else set()
        if taken:
            log.info("%s adopts %d runs that no process held, idle for %g s or more", self.id, len(taken), stall_after)
        self._took(taken, started)
        return taken

    async def lease_of(self, run_ids: list[str]) -> dict[str, tuple[str | None, float | None]]:
        """Run id -> ``(holder, lease's end)`` of ``run_ids`` (see :meth:`RunLeases.held`)."""
        return await self._call(self.leases.held, run_ids)

    def _took(self, taken: set[str], started: float) -> None:
        for run_id in taken:
            self.held.add(run_id)
            self._claimed[run_id] = started
            self.fenced.pop(run_id, None)
        self.adopted += len(taken)


class Claims:
    """An engine observer that claims each run the engine appends to, before the new
    events are published (the engine host's: on the in-process bus a run's events are
    delivered where they are appended). A fenced run is not claimed back: another
    process adopted it. A claim that fails is logged: the run goes on unclaimed (a
    process adopts it once it has been idle for ``STALL_AFTER``). Told of appends only
    (an :class:`~aaa_django.runtime.observe.AppendObserver`)."""

    def __init__(self, keeper: RunKeeper) -> None:
        self.keeper = keeper

    async def appended(self, events: Sequence[Event]) -> None:
        keeper = self.keeper
        ended = {e.stream for e in events if e.type == RUN_COMPLETED}
        runs = {e.stream for e in events} - ended
        for run_id in sorted(runs):
            if run_id in keeper.fenced:
                continue
            try:
                await keeper.claim(run_id)
            except Exception as exc:
                log.warning("could not claim run %s (%s: %s): it goes on unclaimed", run_id, type(exc).__name__, exc)


def _ago(since: float | None) -> str:
    return "never" if since is None else f"{time.monotonic() - since:.1f} s"
