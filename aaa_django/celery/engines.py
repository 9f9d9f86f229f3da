"""A worker's engines: the engine a worker process delivers with, and the cluster's
tool pools.

:func:`build_worker_engine` builds the site's engine (:func:`~aaa_django.site.engines.build_engine`)
on the store a delivery's message names, on a :class:`~aaa_django.celery.bus.DistributedBus`,
with the site's handlers; their tool pools are shared by the whole cluster
(:func:`share_pools`, through Redis: :mod:`aaa_django.celery.coordination`). A Django
store's sync calls run on :data:`DB_THREADS` threads of the process; the
:class:`~aaa_django.celery.worker.WorkerRuntime` keeps the engines (one per store) and
those threads.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence

from celery import Celery

from aaa_django.events.tail import TailCachedStore
from aaa_django.runtime import Engine
from aaa_django.site.engines import attach_site_handlers, build_engine
from aaa_django.store.offload import OnThreads
from aaa_django.tools.handler import ToolHandler

from .bus import DistributedBus, coordinator, open_store
from .coordination import SharedPool

#: threads that make a worker process's store calls, each on a database connection of
#: its own: the loop goes on with other deliveries while a statement waits for the
#: database (a commit's fsync), and concurrent commits share the server's flushes
DB_THREADS = 8


def build_worker_engine(
    spec: Sequence[str], app: Celery | None = None, db: concurrent.futures.Executor | None = None
) -> Engine:
    """The engine a worker delivers with: the site's engine on ``spec``'s store, on a
    :class:`DistributedBus` that sends through the Celery ``app`` (default: the
    site's), with the site's handlers (as the web process's
    ``EngineHost`` attaches them: ``AAA["LLM_CLIENT"]``, ``AAA["TOOLS"]``,
    ``AAA["WORKER_SETUP"]``) and their tool pools shared by the whole cluster.
    ``db``: an executor whose threads make a Django store's sync calls, each on a
    database connection of its own (:class:`~aaa_django.store.offload.OnThreads`;
    default: Django's thread-sensitive executor). A
    :class:`~aaa_django.store.postgres.PgEventStore` on PostgreSQL with psycopg 3 (the
    store ``build_engine()`` gives the web process there) awaits the engine's calls on
    the loop instead, on its own connections, with group commit: only what it leaves
    to the Django store (erasing, the sweeper's and the duty's queries, an append that
    is not the common case) goes to ``db``."""
    using = spec[1] if spec[0] == "django" else "default"
    offload = OnThreads(db, using) if db is not None and spec[0] == "django" else None
    store = open_store(spec, offload=offload)
    engine = build_engine(using=using, store=TailCachedStore(store), bus=DistributedBus(in_worker=True, app=app))
    attach_site_handlers(engine)
    share_pools(engine)
    return engine


def cluster_bus(engine: Engine) -> DistributedBus:
    """The engine's bus, the Celery bus (a worker's engine, see :func:`build_worker_engine`)."""
    bus = engine.bus
    if not isinstance(bus, DistributedBus):
        raise TypeError(f"a worker delivers on the Celery bus, not on {bus!r}")
    return bus


def shared_pool(name: str, size: int) -> SharedPool:
    """A ``ToolHandler`` ``pool_factory`` whose pools hold across the whole cluster:
    ``ToolHandler(registry, pools={"db": 2}, pool_factory=shared_pool)``."""
    return coordinator().pool(name, size)


def share_pools(engine: Engine) -> int:
    """Make the pools of every ToolHandler on ``engine`` cluster-wide (workers do this
    to the handlers ``WORKER_SETUP`` attached); returns how many handlers changed."""
    handlers = {id(h): h for h in engine.tool_servers if isinstance(h, ToolHandler)}
    coord = cluster_bus(engine).coordination()
    for handler in handlers.values():
        handler.use_pools(coord.pool)
    return len(handlers)
