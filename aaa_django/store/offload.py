"""Where the Django store's sync calls run for an async caller.

Django's ORM is sync: the Django store's async methods (the protocol the engine awaits)
are its ``*_sync`` methods run off the event loop by an :class:`Offload`, given to the
store when it is made (``DjangoEventStore(using, offload=...)``):

- :func:`in_django_executor`, the default: Django's thread-sensitive executor
  (asgiref's ``sync_to_async(thread_sensitive=True)``), where a web process's sync
  code and its transactions live (one thread a process);
- :class:`OnThreads`: the threads of an executor, each with a Django connection of
  its own (a Celery worker's, :mod:`aaa_django.celery.worker`: its loop goes on while
  a statement waits for the database, and concurrent commits share the server's
  flushes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connections

__all__ = ["Offload", "OnThreads", "forget_queries", "in_django_executor"]

T = TypeVar("T")
P = ParamSpec("P")


class Offload(Protocol):
    """Runs the sync ``fn(*args, **kwargs)`` off the calling event loop; awaitable."""

    def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]: ...


async def in_django_executor(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in Django's thread-sensitive executor (the store's default
    :class:`Offload`)."""
    return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)


class OnThreads:
    """An :class:`Offload` onto ``executor``'s threads, whose Django connections to
    ``using`` serve the calls: a call that finds its connection broken closes it (the
    thread's next call connects anew), and each call ends with the thread's log of
    queries emptied (:func:`forget_queries`)."""

    def __init__(self, executor: concurrent.futures.Executor, using: str) -> None:
        self.executor = executor
        self.using = using

    def __repr__(self) -> str:
        return f"OnThreads({self.executor!r}, using={self.using!r})"

    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        call = functools.partial(self._on_thread, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    def _on_thread(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except (InterfaceError, OperationalError):
            connections[self.using].close_if_unusable_or_obsolete()
            raise
        finally:
            forget_queries()


def forget_queries() -> None:
    """Empty this thread's log of the queries its connections made, if DEBUG keeps
    one. Django empties it when a web request starts (``request_started``); a store's
    threads serve no request: each call ends one. Without this, with DEBUG on (the
    example site's default), each of their connections keeps its last 9,000 statements
    with their parameters: ~4.5 KB more for every one-turn run the process serves."""
    from django.conf import settings

    if settings.DEBUG:
        from django.db import reset_queries

        reset_queries()
