"""``EngineHost``: the web process's engine, on an event loop that outlives requests.

A sync view cannot run the engine itself: the loop ``async_to_sync`` makes for a
call dies when the call returns, and with it the in-process bus's background work
(the run's next steps, its model and tool calls). The host keeps one engine per
process on a daemon thread with its own long-lived loop, and views hand it work:

    from aaa_django.site.host import EngineHost
    run = EngineHost.get().call(lambda engine: engine.start("acme.summarise", {...}))

The engine is :func:`~aaa_django.site.engines.build_engine` over the site's database
(whose store keeps the run index in step), with the handlers the settings
name: ``AAA["LLM_CLIENT"]`` (a factory returning an LLM client; without one, model
requests fail with a clear reason), ``AAA["TOOLS"]`` (tools it may run) and, when
set, ``AAA["WORKER_SETUP"]`` (called with the engine, as Celery workers do).
Algorithms are found by their registered names (``aaa_django.runtime.registry``).

On the in-process bus the host drives the runs it starts, and holds a lease on each
(:mod:`aaa_django.site.holding`: a :class:`~aaa_django.site.holding.RunKeeper`, renewed
every quarter of ``AAA["RUN_LEASE_TTL"]``). It also adopts the unfinished runs whose
holder is gone (a process of this machine that has ended, a lease that lapsed, a run
no process holds that has been idle for ``STALL_AFTER``) and finishes them with the
site's handlers: a web server killed with runs in flight and started again finishes
them by itself, and several web processes at once adopt each run once. The host starts
with the process's first request (``request_started``; ``AAA["ADOPT"]``) or its first
use, whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeAlias, TypeVar

from aaa_django.conf import aaa_settings
from aaa_django.runtime import Engine, InProcessBus

from .engines import attach_site_handlers, build_engine
from .holding import Claims, RunKeeper

log = logging.getLogger("aaa_django.host")

R = TypeVar("R")

#: work for the engine: ``fn(engine)``, a coroutine (it is run on the host's loop)
EngineWork: TypeAlias = Callable[[Engine], Coroutine[Any, Any, R]]

#: seconds a view waits for the engine by default
DEFAULT_TIMEOUT = 30.0


class EngineUnavailable(RuntimeError):
    """The host's engine did not answer in time, or is shut down."""


class HostBus(InProcessBus):
    """The engine host's in-process bus: it tells the handlers whether this process
    still holds a run (:class:`~aaa_django.runtime.holding.HoldsRuns`), as its keeper
    says."""

    def __init__(self, keeper: RunKeeper) -> None:
        super().__init__()
        self.keeper = keeper

    def holds(self, run_id: str) -> bool:
        return self.keeper.holds(run_id)


class EngineHost:
    """One engine on a daemon thread's event loop; ``call`` runs coroutines on it."""

    _instance: EngineHost | None = None
    _instance_lock = threading.Lock()

    def __init__(self, *, using: str = "default", setup: Callable[[Engine], None] | None = None) -> None:
        self.using = using
        self._setup = setup
        self.engine: Engine | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        #: the process's leases on the runs it drives (the in-process bus only)
        self.keeper: RunKeeper | None = None
        self._tending: asyncio.Task | None = None

    # -- the process-wide instance -----------------------------------------------------

    @classmethod
    def get(cls, timeout: float | None = DEFAULT_TIMEOUT) -> EngineHost:
        """The process's host, started on first use. One that is still starting (its
        engine's build imports the model client's library, starts MCP servers, runs
        ``WORKER_SETUP``) is waited for up to ``timeout`` seconds, then
        :class:`EngineUnavailable` (503 over the API) while it goes on starting for
        the next caller: never a second host beside it. One that failed to start, or
        stopped, is replaced."""
        with cls._instance_lock:
            host = cls._instance
            if host is None or not (host.alive or host.starting):
                host = cls._instance = cls()
                host._launch()
        return host.ready(timeout)

    @classmethod
    def start_soon(cls) -> None:
        """Start the process's host if it is not running, without waiting for it (the
        first request of a web process does, see :func:`on_request`)."""
        host = cls._instance
        if host is not None and (host.alive or host.starting):
            return
        with cls._instance_lock:
            host = cls._instance
            if host is None or not (host.alive or host.starting):
                host = cls._instance = cls()
                host._launch()

    @classmethod
    def reset(cls, timeout: float = 5.0) -> None:
        """Shut the process's host down (tests; settings changed). The next ``get``
        starts a new one."""
        with cls._instance_lock:
            host, cls._instance = cls._instance, None
        if host is not None:
            host.shutdown(timeout)

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.engine is not None

    @property
    def starting(self) -> bool:
        """Its thread is building the engine."""
        return self._thread is not None and self._thread.is_alive() and not self._ready.is_set()

    def start(self, timeout: float | None = DEFAULT_TIMEOUT) -> EngineHost:
        """Start the thread and wait for the engine (see :meth:`ready`)."""
        self._launch()
        return self.ready(timeout)

    def _launch(self) -> None:
        self._thread = threading.Thread(target=self._main, name="aaa-engine-host", daemon=True)
        self._thread.start()

    def ready(self, timeout: float | None = DEFAULT_TIMEOUT) -> EngineHost:
        """This host once its engine is built (waiting up to ``timeout`` seconds);
        :class:`EngineUnavailable` if it is still starting then, or failed to start."""
        if not self._ready.wait(timeout):
            raise EngineUnavailable(f"the engine host is still starting after {timeout} s")
        if self._error is not None:
            raise EngineUnavailable(f"the engine host failed to start: {self._error}") from self._error
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        try:
            self.engine = self.build()
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        if self.keeper is not None:
            self._tending = loop.create_task(self._tend(self.engine, self.keeper))
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def build(self) -> Engine:
        """The engine and its handlers, from the settings (on the in-process bus, with
        the process's keeper of its runs' leases)."""
        if aaa_settings()["BUS"] == "inprocess":
            self.keeper = RunKeeper(self.using, name="web")
            engine = build_engine(using=self.using, bus=HostBus(self.keeper))
            engine.observe(Claims(self.keeper))
        else:
            engine = build_engine(using=self.using)
        attach_site_handlers(engine)
        if self._setup is not None:
            self._setup(engine)
        return engine

    async def _tend(self, engine: Engine, keeper: RunKeeper) -> None:
        """The host's own duty, on its loop: the heartbeat of its leases (runs held
        across a stand-down driven again), and, with ``AAA["ADOPT"]``, every
        ``DUTY_EVERY`` seconds the runs whose holder is gone adopted and re-driven
        (every ``STALL_AFTER / 2`` those no process holds, idle for ``STALL_AFTER``)."""
        # (a fenced run is another process's now: with no broker to hand it to, it is
        # not driven here)
        keeper.start(on_regained=lambda runs: engine.resume(sorted(runs - keeper.fenced.keys())))
        conf = aaa_settings()
        if not conf["ADOPT"]:
            return
        every = float(conf["DUTY_EVERY"]) or keeper.every
        stall_after = float(conf["STALL_AFTER"])
        clock = asyncio.get_running_loop().time
        swept = clock() - stall_after  # (the first pass looks for idle unheld runs too)
        while True:
            try:
                taken = await keeper.adopt()
                if clock() - swept >= stall_after / 2:
                    swept = clock()
                    taken |= await keeper.adopt_unheld(stall_after)
                if taken:
                    resumed = await engine.resume(sorted(taken))
                    log.info(
                        "re-driving %d adopted runs: %s",
                        len(resumed),
                        " ".join(resumed[:20]) + (" ..." if len(resumed) > 20 else ""),
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the next pass tries again
                log.warning("adopting runs failed (%s: %s); trying again in %g s", type(exc).__name__, exc, every)
            await asyncio.sleep(every)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Close the engine (in-flight work is cancelled; it stays in the log for a
        later ``resume``) and stop the thread."""
        self._ready.wait(timeout)  # one still starting: its engine, once built, is closed too
        loop, thread = self.loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        if self.engine is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout)
            except Exception:  # closing is best effort: the log keeps what was left
                log.warning("closing the host's engine failed", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self.engine = None
        if self.keeper is not None:
            self.keeper.close()

    async def _close(self) -> None:
        if self._tending is not None:
            self._tending.cancel()
        if self.engine is not None:
            await self.engine.close(drain=False)
        if self.keeper is not None:
            # Its runs' calls are cancelled with the engine: another process adopts them now.
            await self.keeper.stop(release=True)

    # -- work --------------------------------------------------------------------------

    def call(self, fn: EngineWork[R], *, timeout: float | None = DEFAULT_TIMEOUT) -> R:
        """Run ``await fn(engine)`` on the host's loop; return its result (or raise
        its exception). Raises :class:`EngineUnavailable` after ``timeout`` seconds
        (the work itself goes on)."""
        loop, engine = self.loop, self.engine
        if loop is None or engine is None or not self.alive:
            raise EngineUnavailable("the engine host is not running")
        # In a context of its own, not a copy of the caller's: under ASGI that names
        # the request's thread as where the engine's thread-sensitive database calls
        # run, and that thread is here, waiting for them (deadlock); the run's work
        # outlives the request, and that thread, too.
        future = contextvars.Context().run(asyncio.run_coroutine_threadsafe, fn(engine), loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            raise EngineUnavailable(f"the engine did not answer within {timeout} s") from None

    def resume(self, run_ids: Iterable[str] | None = None, *, timeout: float | None = DEFAULT_TIMEOUT) -> list[str]:
        """Deliver the events of unfinished runs again here (``Engine.resume``). The host
        adopts the runs whose holder is gone by itself (see the module); this is for
        a run named by hand."""
        return self.call(lambda engine: engine.resume(run_ids), timeout=timeout)


def on_request(sender: object = None, **kwargs: object) -> None:
    """``request_started``: the first request of a web process starts its engine host
    (on the in-process bus, with ``AAA["ADOPT"]``), which adopts the runs whose holder
    is gone. Connected by ``AaaConfig.ready``."""
    host = EngineHost._instance
    if host is not None and (host.alive or host.starting):
        return
    conf = aaa_settings()
    if conf["BUS"] == "inprocess" and conf["ADOPT"]:
        EngineHost.start_soon()
