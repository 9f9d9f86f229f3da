"""A coroutine run on an event loop that runs in another thread (a worker's loop,
:class:`~aaa_django.celery.worker.WorkerRuntime`), by the thread that waits for its
result: :func:`run_on`, and :func:`call_on` for a sync function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` (running in another thread); return its result. An
    interruption of the waiting thread (a soft time limit, a signal) cancels it on the
    loop, wherever it comes: the future that stands for ``coro`` exists before
    ``coro`` is handed to the loop, and the handing over is inside the ``try`` that
    cancels it (``asyncio.run_coroutine_threadsafe`` returns its future only after
    scheduling ``coro``: an interruption inside it left the delivery running on the
    loop, unowned)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    try:
        loop.call_soon_threadsafe(_start, coro, future)
        return future.result()
    except BaseException:
        future.cancel()  # (before the loop starts it: it never runs)
        raise


def call_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: object) -> T:
    """Run the sync ``fn(*args)`` on ``loop``'s thread; return its result."""
    return run_on(loop, _call(fn, *args))


async def _call(fn: Callable[..., T], *args: object) -> T:
    return fn(*args)


def _start(coro: Coroutine[Any, Any, T], future: concurrent.futures.Future[T]) -> None:
    """On the loop (:func:`run_on`): run ``coro`` as a task whose outcome becomes
    ``future``'s; cancelling ``future`` cancels the task, and a ``future`` cancelled
    already never starts it."""
    if future.cancelled():
        coro.close()
        return
    loop = asyncio.get_running_loop()
    try:
        task = loop.create_task(coro)
    except BaseException as exc:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            future.set_exception(exc)
        raise

    def settle(task: asyncio.Task[T]) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # (cancelled meanwhile)
            if task.cancelled():
                future.cancel()
            elif (exc := task.exception()) is not None:
                future.set_exception(exc)
            else:
                future.set_result(task.result())

    def cancel(done: concurrent.futures.Future[T]) -> None:  # (on the thread that cancels it)
        if done.cancelled() and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    task.add_done_callback(settle)
    future.add_done_callback(cancel)
