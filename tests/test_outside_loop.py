"""The one private internal of asyncio the store still uses: ``_outside_loop`` (an
inline Django store's calls, a Celery worker's ``WorkerRuntime.call``) runs a sync
function on the loop's own thread with the running loop hidden
(``asyncio.events._get_running_loop`` / ``_set_running_loop``), so Django's
async-safety check lets the ORM run there, on the thread's one connection, with no
hop to another thread. What that buys is measured in ``benchmarks/README.md``
(``bench_eventlog.py``'s inline rows). These tests fail when asyncio or Django
changes under it.
"""

from __future__ import annotations

import asyncio

import pytest
from django.db import connections

from aaa_django.store.database import _outside_loop


def test_the_loop_is_hidden_during_the_call_and_back_after_it():
    def inside():
        with pytest.raises(RuntimeError):
            asyncio.get_running_loop()
        return asyncio.events._get_running_loop()

    async def main():
        loop = asyncio.get_running_loop()
        hidden = await _outside_loop(inside)()
        return hidden, asyncio.get_running_loop() is loop

    assert asyncio.run(main()) == (None, True)


def test_the_loop_is_back_after_the_call_raises():
    def fails():
        raise ValueError("no")

    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(ValueError):
            await _outside_loop(fails)()
        return asyncio.get_running_loop() is loop

    assert asyncio.run(main())


@pytest.mark.django_db(databases=["default"])
def test_django_lets_the_orm_run_inside_it():
    def query():
        with connections["default"].cursor() as cur:
            cur.execute("SELECT 1")
            return cur.fetchone()[0]

    async def main():
        return await _outside_loop(query)()

    assert asyncio.run(main()) == 1
