"""What workers of one cluster agree on through Redis: locks, leases, notices.

- :meth:`Coordinator.lock`: the per-run lock that serialises algorithm steps across
  processes (``SET NX PX`` with a token, renewed while held; a killed worker's lock
  frees itself after its TTL, or at once for a waiter of its machine: below).
- :meth:`Coordinator.pool`: a named semaphore shared by every worker (a sorted set of
  leases scored by their expiry; a killed worker's leases expire, or are taken: below).
- :meth:`Coordinator.busy`: a lease saying "a delivery of this run is in progress",
  so the sweeper never re-drives a run that a live worker is still working on.
- :meth:`Coordinator.take_turn`: the cluster's turn at a periodic duty (the first
  caller in each period gets it; see :mod:`aaa_django.celery.duty`).
- :meth:`Coordinator.notify_ended` / :meth:`Coordinator.wait_ended`: a pub/sub notice
  that a run has ended, so a tool call running in another worker is cancelled, and
  (:meth:`Coordinator.ended_notices`) a waiting web process wakes at once.

A lock's or lease's token names its holder (:func:`aaa_django.runtime.holding.holder_id`):
one held by a process of this machine that has ended (killed, crashed: its pid gone,
or another process's now) is taken by the next that waits for it at once, not after
its TTL (:func:`_gone`): a worker restarted after a crash makes the calls its
predecessor held without waiting out their leases. One of another machine lapses with
its TTL.

Time in leases is the Redis server's clock (``TIME`` inside the scripts), so workers
with skewed clocks still agree on what has expired. A coordinator uses a synchronous
client (thread-safe, any caller) and one asyncio client per event loop, of at most
:data:`ASYNC_CONNECTIONS` connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from redis.asyncio import Redis as AsyncRedis
    from redis.asyncio.client import PubSub
    from redis.commands.core import AsyncScript

from aaa_django.runtime.holding import holder_id, process_gone

log = logging.getLogger("aaa_django.bus")

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: the lease set. ARGV: size (0 = no limit), ttl ms, token. 1 if the lease is held.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local size = tonumber(ARGV[1])
if size > 0 and redis.call('ZCARD', KEYS[1]) >= size then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
"""
# KEYS: the lease set. ARGV: ttl ms, token, size (0 = no limit). 1 if the lease was
# still ours; 2 if it had lapsed and, the set having no limit, is ours again; else 0.
_RENEW_LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = 1
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    if tonumber(ARGV[3]) > 0 then return 0 end
    held = 2
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)
return held
"""
# KEYS: the lease set. The number of live leases.
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


#: connections of a loop's asyncio client at most (its commands wait for a free one);
#: the run-ended notices of every wait of the loop take one (see :class:`_Ends`)
ASYNC_CONNECTIONS = 50
#: seconds a command waits for Redis's answer, or a connect for Redis, at most (a
#: subscription's reads wait as long as they say); and TCP keepalives, so a Redis gone
#: silent (a partition) is found within seconds on an idle connection too
SOCKET_TIMEOUT = 5.0
_KEEPALIVE = {"socket_keepalive": True, "health_check_interval": 10}


def _keepalive_options() -> dict[int, int]:
    """TCP keepalive after 2 s of silence, then a probe a second, 3 probes (Linux)."""
    import socket

    names = (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3))
    return {getattr(socket, n): v for n, v in names if hasattr(socket, n)}


#: (pid, holder id) of this process (a forked child makes its own)
_holder: tuple[int, str] | None = None
#: seconds between two looks, by one waiter, for a holder that has ended
GONE_EVERY = 1.0


def _token() -> str:
    """A new token: this process's holder id, ``#``, a random part."""
    global _holder
    pid = os.getpid()
    if _holder is None or _holder[0] != pid:
        _holder = (pid, holder_id("lease"))
    return f"{_holder[1]}#{os.urandom(8).hex()}"


def _gone(tokens: Iterable[object]) -> list[bytes | str]:
    """The tokens among ``tokens`` (Redis's answer: bytes) whose holder is a process of
    this machine that has ended (:func:`~aaa_django.runtime.holding.process_gone`)."""
    out: list[bytes | str] = []
    for token in tokens:
        if not isinstance(token, bytes | str):
            continue
        text = token.decode(errors="replace") if isinstance(token, bytes) else token
        holder, mark, _ = text.rpartition("#")
        if mark and process_gone(holder):
            out.append(token)
    return out


def _unheard(answer: asyncio.Future[object]) -> None:
    """A run-ended notice's answer, when nobody waits for it: a failure said."""
    if not answer.cancelled() and answer.exception() is not None:
        log.warning(
            "a run-ended notice was not sent (%s); the waits find the end at their next poll", answer.exception()
        )


class _Queued(NamedTuple):
    """A command of a :class:`_Batch`: its words, its caller's answer, and what undoes it."""

    command: tuple[object, ...]
    answer: asyncio.Future[object]
    undo: tuple[object, ...] | None


def _not_undone(answer: asyncio.Future[object]) -> None:
    """An undo's answer, when nobody waits for it: a failure said."""
    if not answer.cancelled() and answer.exception() is not None:
        log.warning(
            "a lease taken for a taker cancelled meanwhile was not let go of (%s); it expires", answer.exception()
        )


class _Batch:
    """The lease commands one event loop asks for in one pass, sent to Redis together:
    one pipeline (not a transaction), one round trip for them all, each caller given
    its own command's answer or error. A worker's loop takes and lets go of a model
    request's lease for every call, hundreds in one pass at 3,000 runs in flight: with
    each command sent alone (redis-py's client work for a command and its round trip)
    and a renewal's task each, a lease cost 0.21-0.31 ms of the process's CPU; batched,
    with a renewal's task only past a third of the TTL, 0.07-0.14 ms
    (``benchmarks/bench_leases.py``). A script goes as ``EVAL`` (Redis keeps it
    compiled, by its digest), so a pipeline needs no ``SCRIPT LOAD`` first. Used on its
    loop only."""

    def __init__(self, client: AsyncRedis) -> None:
        self.client = client
        self.queued: list[_Queued] = []
        #: pipelines sent, and the commands they carried (tests, benchmarks)
        self.pipelines = 0
        self.commands = 0
        #: commands undone because their waiter was cancelled while they were on their way
        self.undone = 0
        #: the pipelines under way (their tasks, kept until done)
        self._sending: set[asyncio.Task[None]] = set()

    def send(self, *command: object, undo: tuple[object, ...] | None = None) -> asyncio.Future[object]:
        """Queue ``command`` for this pass's pipeline; its answer, as a future. A waiter
        that is cancelled leaves the command to go with its pipeline, unless it gives
        ``undo``: the command that undoes what this one did, when its answer is true (a
        lease's acquire, whose ``undo`` lets the lease go). Such a command whose waiter
        was cancelled before its pipeline went is not sent, and one whose waiter was
        cancelled while it was on its way is undone if it took something: a taker that
        stopped waiting (a model request's first attempt is reserved for at most
        ``RESERVE_WAIT``) leaves no lease held by no one until its TTL runs out."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[object] = loop.create_future()
        self.queued.append(_Queued(command, answer, undo))
        if len(self.queued) == 1:
            loop.call_soon(self._flush)
        return answer

    def _flush(self) -> None:
        batch = [q for q in self.queued if q.undo is None or not q.answer.cancelled()]
        self.queued = []
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Queued]) -> None:
        self.pipelines += 1
        self.commands += len(batch)
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for queued in batch:
                    pipe.execute_command(*queued.command)
                answers = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # (Redis away: every caller gets the error, as alone)
            for queued in batch:
                if not queued.answer.done():
                    queued.answer.set_exception(exc if isinstance(exc, Exception) else ConnectionError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for queued, got in zip(batch, answers, strict=True):
            answer = queued.answer
            if not answer.done():
                if isinstance(got, Exception):
                    answer.set_exception(got)
                else:
                    answer.set_result(got)
            elif answer.cancelled() and queued.undo is not None and got and not isinstance(got, Exception):
                self.undone += 1
                self.send(*queued.undo).add_done_callback(_not_undone)


class Coordinator:
    """Cluster coordination on the Redis at ``url``; keys under ``{prefix}:``.

    ``lock_ttl`` and ``lease_ttl`` are seconds; held locks and leases are renewed
    every third of their TTL. ``socket_timeout``: seconds a client waits for Redis at
    most (:data:`SOCKET_TIMEOUT` by default); both clients keep their connections
    alive with TCP keepalives.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "aaa",
        lock_ttl: float = 10,
        lease_ttl: float = 30,
        socket_timeout: float | None = SOCKET_TIMEOUT,
    ) -> None:
        import redis

        self.url = url
        self.prefix = prefix
        self.lock_ttl = float(lock_ttl)
        self.lease_ttl = float(lease_ttl)
        self.socket_timeout = socket_timeout
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            socket_keepalive_options=_keepalive_options(),
            **_KEEPALIVE,
        )
        self._tag = "{" + prefix + "}"
        self._aclients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[AsyncRedis, dict[str, AsyncScript]]
        ] = weakref.WeakKeyDictionary()
        self._local_locks: weakref.WeakValueDictionary[tuple, asyncio.Lock] = weakref.WeakValueDictionary()
        self._loop_ends: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ends] = weakref.WeakKeyDictionary()
        self._batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Batch] = weakref.WeakKeyDictionary()
        self._live = self.client.register_script(_LIVE)

    def __repr__(self) -> str:
        return f"Coordinator({self.url!r}, prefix={self.prefix!r})"

    def key(self, kind: str, name: str) -> str:
        return f"{self._tag}:{kind}:{name}"

    def channel(self, run_id: str) -> str:
        return f"{self.prefix}:ended:{run_id}"

    def _async(self) -> tuple[AsyncRedis, dict[str, AsyncScript]]:
        """This loop's asyncio client and its scripts."""
        loop = asyncio.get_running_loop()
        entry = self._aclients.get(loop)
        if entry is None:
            import redis.asyncio

            # Commands wait for a free connection (up to 20 s) rather than fail: redis-py's
            # plain pool raises "Too many connections" at its bound.
            client = redis.asyncio.Redis(
                connection_pool=redis.asyncio.BlockingConnectionPool.from_url(
                    self.url,
                    max_connections=ASYNC_CONNECTIONS,
                    timeout=20,
                    socket_timeout=self.socket_timeout,
                    socket_connect_timeout=self.socket_timeout,
                    socket_keepalive_options=_keepalive_options(),
                    **_KEEPALIVE,
                )
            )
            scripts = {
                name: client.register_script(lua)
                for name, lua in (
                    ("unlock", _UNLOCK),
                    ("renew_lock", _RENEW_LOCK),
                    ("renew_lease", _RENEW_LEASE),
                )
            }
            entry = self._aclients[loop] = (client, scripts)
        return entry

    def batch(self) -> _Batch:
        """This loop's :class:`_Batch` of lease commands."""
        loop = asyncio.get_running_loop()
        batch = self._batches.get(loop)
        if batch is None:
            batch = self._batches[loop] = _Batch(self._async()[0])
        return batch

    # -- the per-run lock --------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lock(self, run_id: str) -> AsyncIterator[None]:
        """Hold run ``run_id``'s lock across the cluster (FIFO within a process)."""
        local = self._local_lock(("lock", run_id))
        async with local:
            client, scripts = self._async()
            key, token = self.key("lock", run_id), _token()
            ttl_ms = int(self.lock_ttl * 1000)
            delay = 0.001
            look = 0.0  # (when to look for a holder that has ended: at once, then every GONE_EVERY)
            clock = asyncio.get_running_loop().time
            while not await client.set(key, token, nx=True, px=ttl_ms):
                if clock() >= look:
                    look = clock() + GONE_EVERY
                    holder = await client.get(key)
                    if holder is not None and _gone([holder]):
                        log.info("took %s from a process that has ended", key)
                        await scripts["unlock"](keys=[key], args=[holder])
                        continue
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.05)
            # Most steps take milliseconds: renew from a timer (nothing to start or to
            # wait for when the step is quick), which starts the renewing task only
            # for a step that is still running at a third of the TTL.
            renewing: list[asyncio.Future] = []
            stop = asyncio.Event()

            def start_renewing() -> None:
                renewing.append(
                    asyncio.ensure_future(
                        self._keep(
                            lambda: scripts["renew_lock"](keys=[key], args=[token, ttl_ms]),
                            self.lock_ttl,
                            key,
                            stop,
                            first=0,
                        )
                    )
                )

            timer = asyncio.get_running_loop().call_later(self.lock_ttl / 3, start_renewing)
            try:
                yield
            finally:
                timer.cancel()
                stop.set()
                for renew in renewing:
                    renew.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await renew
                await scripts["unlock"](keys=[key], args=[token])

    def _local_lock(self, key: tuple) -> asyncio.Lock:
        lock = self._local_locks.get(key)
        if lock is None:
            lock = self._local_locks[key] = asyncio.Lock()
        return lock

    async def _keep(
        self,
        renew: Callable[[], Awaitable[object]],
        ttl: float,
        what: str,
        stop: asyncio.Event,
        *,
        first: float | None = None,
    ) -> None:
        """Renew every third of ``ttl`` (the first time after ``first`` seconds) until
        ``stop`` is set. The holder sets ``stop`` before it cancels this task: redis-py
        may swallow a cancellation that lands in the middle of a command, and a renewal
        that went on would keep the lease alive for ever (its holder waiting on it)."""
        wait = ttl / 3 if first is None else first
        clock = asyncio.get_running_loop().time
        last = clock()  # the last time it was known held (taken, or renewed)
        while True:
            try:
                await asyncio.wait_for(stop.wait(), wait)
                return
            except TimeoutError:
                pass
            wait = ttl / 3
            try:
                asked = clock()
                held = await renew()
                # (how late: the renewal asked for it this long after it was last held, and
                # Redis answered that much later)
                late = f"{asked - last:.2f} s after it was last held, answered in {clock() - asked:.2f} s"
                if not held:
                    log.error("lost %s while holding it (held past its TTL of %g s? renewed %s)", what, ttl, late)
                    return
                if held == 2:  # (a mark with no limit: taken again)
                    log.warning("%s had lapsed while held (its TTL %g s; renewed %s); held again", what, ttl, late)
                last = asked
            except Exception:  # Redis away for a moment: try again next time
                log.warning("could not renew %s", what, exc_info=True)

    # -- leases: shared pools and busy marks -------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(self, kind: str, name: str, size: int = 0, *, poll: float = 0.01) -> AsyncIterator[None]:
        """Hold one of ``size`` leases on ``kind:name`` (0: unlimited) while inside. Taken
        and let go of in the loop's :class:`_Batch`; renewed every third of
        ``lease_ttl`` once held that long."""
        client, scripts = self._async()
        batch = self.batch()  # (taken and let go of together with the loop's others)
        key, token = self.key(kind, name), _token()
        ttl_ms = int(self.lease_ttl * 1000)
        delay = poll
        look = 0.0  # (when to look for holders that have ended: at once, then every GONE_EVERY)
        loop = asyncio.get_running_loop()
        clock = loop.time
        # (a taker cancelled while its command is on its way: the lease it took, if
        # it took it, is let go of when the answer comes, see _Batch.send)
        while not await batch.send("EVAL", _ACQUIRE, 1, key, int(size), ttl_ms, token, undo=("ZREM", key, token)):
            if clock() >= look:
                look = clock() + GONE_EVERY
                if await self._clear_gone(client, key):
                    continue
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 1.5, 0.2)
        stop = asyncio.Event()
        keeper: list[asyncio.Future[None]] = []

        def keep() -> None:
            # Held for a third of its TTL: renewed from now on, every third. (Most leases
            # are let go of sooner, a model call's within seconds: no task for them.)
            renew = partial(scripts["renew_lease"], keys=[key], args=[ttl_ms, token, int(size)])
            keeper.append(asyncio.ensure_future(self._keep(renew, self.lease_ttl, key, stop, first=0.0)))

        timer = loop.call_later(self.lease_ttl / 3, keep)
        try:
            yield
        finally:
            timer.cancel()
            stop.set()
            for task in keeper:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):  # an unreleased lease expires anyway
                await batch.send("ZREM", key, token)

    async def _clear_gone(self, client: AsyncRedis, key: str) -> int:
        """Let go of the leases on ``key`` whose holders have ended; how many."""
        gone = _gone(await client.zrange(key, 0, -1))
        if gone:
            log.info("took %d of %s from processes that have ended", len(gone), key)
            await client.zrem(key, *gone)
        return len(gone)

    def pool(self, name: str, size: int) -> SharedPool:
        """A semaphore of ``size`` shared by every worker, usable as ``async with``."""
        return SharedPool(self, name, size)

    def busy(self, run_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """``async with``: mark a delivery of ``run_id`` as in progress."""
        return self.lease("busy", run_id)

    def is_busy(self, run_id: str) -> bool:
        """Whether a live worker is delivering an event of ``run_id`` (sync)."""
        key = self.key("busy", run_id)
        self._clear_gone_sync(key)
        return bool(self._live(keys=[key]))

    def in_use(self, name: str) -> int:
        """Leases held now in pool ``name`` (sync)."""
        key = self.key("pool", name)
        self._clear_gone_sync(key)
        return int(self._live(keys=[key]))

    def _clear_gone_sync(self, key: str) -> None:
        """:meth:`_clear_gone`, on the synchronous client."""
        gone = _gone(self.client.zrange(key, 0, -1))
        if gone:
            self.client.zrem(key, *gone)

    # -- run-ended notices ----------------------------------------------------------------

    def take_turn(self, duty: str, seconds: float) -> bool:
        """Whether this caller has the cluster's turn at ``duty`` for the next
        ``seconds``: the first caller in that time gets it, the others get False."""
        ttl = max(1, int(seconds * 1000))
        return bool(self.client.set(self.key("turn", duty), _token(), nx=True, px=ttl))

    def notify_ended(self, run_id: str) -> None:
        """Tell every worker that ``run_id`` has ended (fire and forget): on an event
        loop (a worker's, where its runs end), with the loop's :class:`_Batch`, not
        waited for; elsewhere, sync. A notice lost is found by the waits' polls."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.client.publish(self.channel(run_id), "1")
            return
        self.batch().send("PUBLISH", self.channel(run_id), "1").add_done_callback(_unheard)

    async def ended_notices(
        self, stop: Callable[[], bool] = lambda: False, subscribed: Callable[[], None] | None = None
    ) -> AsyncIterator[str]:
        """The ids of runs as they end anywhere in the cluster (one pattern
        subscription; notices published while nobody listens are lost), until
        ``stop()``: checked at least every second (a blocking read is not reliably
        interrupted by cancelling its task). ``subscribed()`` is called once the
        subscription is up."""
        client, _ = self._async()
        pubsub = client.pubsub()
        prefix = self.channel("")
        try:
            await pubsub.psubscribe(prefix + "*")
            if subscribed is not None:
                subscribed()
            while not stop():
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None and message.get("type") == "pmessage":
                    channel = message["channel"]
                    channel = channel.decode() if isinstance(channel, bytes) else channel
                    yield channel[len(prefix) :]
        finally:
            await _drop(pubsub)

    async def wait_ended(self, run_id: str, ended: Callable[[], Awaitable[bool]], *, poll: float = 2.0) -> None:
        """Return when ``run_id`` has ended: on its notice, or when ``ended()`` says so
        (checked once the loop's subscription is up, then every ``poll`` seconds:
        notices are not durable). Every wait of a loop shares one subscription (see
        :class:`_Ends`): a worker holding hundreds of tool calls holds one connection
        for their notices, not one each."""
        ends = self._ends()
        heard = ends.watch(run_id)
        try:
            await ends.up(poll)
            while not await ended():
                try:
                    async with asyncio.timeout(poll):
                        await heard.wait()
                    return
                except TimeoutError:
                    ends.keep_up()  # (a listener that lost Redis starts again)
        finally:
            ends.unwatch(run_id, heard)

    def _ends(self) -> _Ends:
        """This loop's shared subscription to run-ended notices."""
        loop = asyncio.get_running_loop()
        ends = self._loop_ends.get(loop)
        if ends is None:
            ends = self._loop_ends[loop] = _Ends(self)
        return ends


class _Ends:
    """One pattern subscription (:meth:`Coordinator.ended_notices`) on one connection
    for every :meth:`Coordinator.wait_ended` of an event loop: a listener task, started
    by the first wait and ended once no wait is left (within a second), sets the waits
    of the run whose notice it hears. (One subscription per wait held one
    connection of the loop's pool each: at 200 runs a worker's slow tool calls took
    all of it, and its leases' renewals found none, "Too many connections".)"""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.prefix = coordinator.channel("")
        #: run id -> the waits on it (each an event the listener sets)
        self.waits: dict[str, set[asyncio.Event]] = {}
        self.subscribed = asyncio.Event()
        self.task: asyncio.Task | None = None

    def watch(self, run_id: str) -> asyncio.Event:
        heard = asyncio.Event()
        self.waits.setdefault(run_id, set()).add(heard)
        self.keep_up()
        return heard

    def unwatch(self, run_id: str, heard: asyncio.Event) -> None:
        waits = self.waits.get(run_id)
        if waits is not None:
            waits.discard(heard)
            if not waits:
                del self.waits[run_id]

    def keep_up(self) -> None:
        """Start the listener if it is not running."""
        if self.task is None or self.task.done():
            self.subscribed.clear()
            self.task = asyncio.ensure_future(self._listen())

    async def up(self, timeout: float) -> None:
        """Wait until the subscription is up (at most ``timeout``: without Redis the
        waits poll). (``asyncio.timeout``, not ``wait_for``: Python 3.11's ``wait_for``
        loses a cancellation that lands as its awaitable completes, and a cancelled
        wait would then go on for good.)"""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.subscribed.wait()

    async def _listen(self) -> None:
        idled = False
        try:
            async for run_id in self.coordinator.ended_notices(lambda: not self.waits, self.subscribed.set):
                for heard in self.waits.get(run_id, ()):
                    heard.set()
            idled = True  # no wait left (the next wait starts it again)
        except Exception:  # Redis away: the waits poll; the next poll starts it again
            log.debug("the run-ended subscription failed", exc_info=True)
        finally:
            self.subscribed.clear()
        if idled and self.waits and self.task is asyncio.current_task():
            # a wait came while it closed (it found this task not yet done)
            self.task = asyncio.ensure_future(self._listen())


async def _drop(pubsub: PubSub) -> None:
    """Close a subscription's connection without a word to the server: after a
    cancelled read the connection may be mid-reply, and an UNSUBSCRIBE could wait for
    an answer that never comes. Closing it ends the subscription too."""
    with contextlib.suppress(Exception, asyncio.TimeoutError):
        await asyncio.wait_for(pubsub.aclose(), 2)


class SharedPool:
    """``async with pool:`` holds one lease of a cluster-wide pool (like
    ``asyncio.Semaphore``, which ToolHandler uses in one process)."""

    def __init__(self, coordinator: Coordinator, name: str, size: int) -> None:
        self.coordinator = coordinator
        self.name = name
        self.size = size
        self._held: dict[asyncio.Task[object] | None, AbstractAsyncContextManager[None]] = {}

    def __repr__(self) -> str:
        return f"SharedPool({self.name!r}, {self.size})"

    async def __aenter__(self) -> SharedPool:
        cm = self.coordinator.lease("pool", self.name, max(1, int(self.size)))
        await cm.__aenter__()
        self._held[asyncio.current_task()] = cm
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        cm = self._held.pop(asyncio.current_task())
        await cm.__aexit__(exc_type, exc, tb)
