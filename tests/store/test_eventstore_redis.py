"""The Redis store passes the EventStore contract (aaa_django/testing/eventstore.py).

Each test gets its own key prefix on the Redis server bin/test starts, so tests never
see each other's logs; the keys are deleted afterwards.
"""

from __future__ import annotations

import uuid

import pytest

from aaa_django.store.redis import RedisEventStore
from aaa_django.testing.eventstore import EventStoreContract, ev, run


@pytest.mark.redis
class TestRedisEventStore(EventStoreContract):
    def make_store(self, request):
        url = request.getfixturevalue("redis_url")
        store = RedisEventStore(url, prefix=f"test-{uuid.uuid4().hex[:12]}")
        request.addfinalizer(lambda: _delete_prefix(store))
        return store

    def same_log(self, store):
        url = store.client.connection_pool.connection_kwargs
        return RedisEventStore(f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}", prefix=store.prefix)

    def test_another_prefix_is_another_log(self, store):
        other = RedisEventStore(client=store.client, prefix=store.prefix + "-other")
        run(store.append([ev()]))

        assert other.cache_key != store.cache_key
        assert run(other.streams()) == [] and run(other.read("run-1")) == []
        _delete_prefix(other)

    def test_every_key_of_a_log_shares_one_cluster_slot(self, store):
        run(store.append([ev()]))
        run(store.save_snapshot(self.snap(1)))

        keys = list(store.client.scan_iter(match=f"{{{store.prefix}}}:*"))

        # events, ids, streams, snapshots: one hash tag, so one slot on a Redis Cluster
        assert len(keys) == 4
        assert all(k.startswith(f"{{{store.prefix}}}:".encode()) for k in keys)


def _delete_prefix(store: RedisEventStore) -> None:
    keys = list(store.client.scan_iter(match=f"{{{store.prefix}}}:*", count=1000))
    if keys:
        store.client.delete(*keys)
