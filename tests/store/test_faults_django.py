"""Driver errors stop at the adapters' boundary (aaa_django.store.faults): real services'
failures leave the stores as the core's InfrastructureError, transient or persistent,
and a store whose database connection was lost connects again by itself.

The engine's side (what a transient or a persistent failure does to a run) is in
tests/runtime/test_faults.py; a run hitting a missing S3 bucket on both buses in
tests/celery/test_infrastructure_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from django.db import connections, transaction

from aaa_django.data import BlobNotFoundError, BlobRef, BlobStoreUnavailable
from aaa_django.events import ConcurrencyError, Event, StoreUnavailable
from aaa_django.site.blobs import StorageBlobStore
from aaa_django.store import DjangoEventStore

PG = pytest.mark.django_db(databases=["default", "postgres"], transaction=True)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nobody listens


def s3_store(options: dict) -> StorageBlobStore:
    from botocore.config import Config
    from storages.backends.s3 import S3Storage

    # one attempt: botocore's own retries would only make the test slower
    return StorageBlobStore(S3Storage(**options, client_config=Config(retries={"max_attempts": 1})))


# -- S3 --------------------------------------------------------------------------------


def test_a_missing_bucket_is_a_persistent_blob_store_failure(s3_bucket):
    from botocore.exceptions import ClientError

    store = s3_store({**s3_bucket, "bucket_name": s3_bucket["bucket_name"] + "-gone"})
    with pytest.raises(BlobStoreUnavailable) as info:
        store.put(b"payload", namespace="run-1")
    assert info.value.transient is False and info.value.service == "blob store"
    assert "NoSuchBucket" in str(info.value) and isinstance(info.value.__cause__, ClientError)


def test_an_unreachable_s3_is_a_transient_blob_store_failure(s3_bucket):
    store = s3_store({**s3_bucket, "endpoint_url": f"http://127.0.0.1:{closed_port()}"})
    with pytest.raises(BlobStoreUnavailable) as info:
        store.put(b"payload", namespace="run-1")
    assert info.value.transient is True


def test_the_blob_stores_own_errors_pass_untranslated(s3_bucket):
    store = s3_store(s3_bucket)
    with pytest.raises(BlobNotFoundError):
        store.get(BlobRef.for_bytes(b"never stored", namespace="run-1"))
    with pytest.raises((TypeError, ValueError)):  # a malformed ref, before any I/O
        store.get(12)


# -- PostgreSQL --------------------------------------------------------------------------


def _event(stream: str, n: int) -> Event:
    return Event(id=f"{stream}-e{n}", stream=stream, type="tests.happened", data={"n": n})


def _terminate(alias: str) -> None:
    """Kill the backend of this thread's connection on ``alias``, as a database restart
    does to every client, from a second connection."""
    _terminate_pids(alias, [connections[alias].cursor().connection.info.backend_pid])


@PG
def test_a_read_on_a_lost_connection_connects_again(pg_alias):
    store = DjangoEventStore(pg_alias)
    store.append_sync([_event("s-read", 1)])
    _terminate(pg_alias)
    assert [e.id for e in store.read_sync("s-read")] == ["s-read-e1"]


@PG
def test_an_append_on_a_lost_connection_is_transient_and_the_next_one_connects(pg_alias):
    store = DjangoEventStore(pg_alias)
    store.append_sync([_event("s-append", 1)])
    _terminate(pg_alias)
    with pytest.raises(StoreUnavailable) as info:
        store.append_sync([_event("s-append", 2)])
    # an outage, not "lost a race" (ConcurrencyError): the caller retries or answers 503
    assert info.value.transient is True and not isinstance(info.value, ConcurrencyError)
    assert [e.seq for e in store.append_sync([_event("s-append", 2)])] == [2]


@PG
def test_a_refused_connection_is_transient(pg_alias, monkeypatch):
    connections[pg_alias].close()
    monkeypatch.setitem(connections[pg_alias].settings_dict, "PORT", str(closed_port()))
    with pytest.raises(StoreUnavailable) as info:
        DjangoEventStore(pg_alias).read_sync("s-any")
    assert info.value.transient is True


@PG
def test_a_missing_table_is_persistent(pg_alias):
    store = DjangoEventStore(pg_alias)
    with pytest.raises(StoreUnavailable) as info:
        with transaction.atomic(using=pg_alias):  # rolled back: the table comes back
            with connections[pg_alias].cursor() as cur:
                cur.execute("ALTER TABLE aaa_event RENAME TO aaa_event_away")
            store.read_sync("s-any")
    assert info.value.transient is False and "aaa_event" in str(info.value)


# -- PostgreSQL through the async store (psycopg's own connections) ------------------------


def _terminate_pids(alias: str, pids: list[int]) -> None:
    """Kill these backends, as a restart does to every client, from a connection of
    its own; each is gone when this returns (pg_terminate_backend's wait)."""
    other = connections.create_connection(alias)
    try:
        with other.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid, 10000) FROM unnest(%s::int[]) AS pid", [pids])
            assert all(ok for (ok,) in cur.fetchall())
    finally:
        other.close()


@contextlib.contextmanager
def _pg_store(alias: str):
    """An async store on connections of its own (not the process's, which other tests
    use: only these are cut)."""
    from aaa_django.store.connections import PgConnections
    from aaa_django.store.postgres import PgEventStore

    store = PgEventStore(alias, group_commit=False)
    assert store.pg is not None, "the async path is what these tests are about"
    store.pg = PgConnections(alias)
    try:
        yield store
    finally:
        store.pg.discard_idle()


async def _backends(store, n: int) -> list[int]:
    """The backend pids of ``n`` connections of ``store``, all open at once (idle in the
    store after)."""
    pids: list[int] = []
    everyone = asyncio.Event()

    async def one() -> None:
        async with store.pg.connection() as conn:
            pids.append((await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0])
            if len(pids) == n:
                everyone.set()
            await everyone.wait()

    await asyncio.gather(*(one() for _ in range(n)))
    return pids


@PG
def test_the_async_store_reads_again_after_its_connections_were_lost(pg_alias):
    with _pg_store(pg_alias) as store:
        asyncio.run(store.append([_event("a-read", 1)]))
        pids = asyncio.run(_backends(store, 3))  # three idle connections
        _terminate_pids(pg_alias, pids)

        async def after():
            return await store.read("a-read"), await store.head("a-read")

        events, head = asyncio.run(after())
    assert [e.id for e in events] == ["a-read-e1"] and head == (1, "a-read-e1")


@PG
def test_the_async_stores_append_on_a_lost_connection_is_transient_and_the_next_one_connects(pg_alias):
    with _pg_store(pg_alias) as store:
        asyncio.run(store.append([_event("a-append", 1)]))
        _terminate_pids(pg_alias, asyncio.run(_backends(store, 1)))
        with pytest.raises(StoreUnavailable) as info:
            asyncio.run(store.append([_event("a-append", 2)]))
        stored = asyncio.run(store.append([_event("a-append", 2)]))
    # an outage, not "lost a race": the bus delivers again, the API answers 503
    assert info.value.transient is True and info.value.service == "event store"
    assert not isinstance(info.value, ConcurrencyError)
    assert [e.seq for e in stored] == [2]


@PG
def test_the_async_stores_refused_connection_is_transient(pg_alias, monkeypatch):
    with _pg_store(pg_alias) as store:  # connections of its own, none open yet
        monkeypatch.setitem(store.pg.django.settings_dict, "PORT", str(closed_port()))
        with pytest.raises(StoreUnavailable) as info:
            asyncio.run(store.read("a-any"))
    assert info.value.transient is True
