"""The in-memory store passes the EventStore contract (aaa_django/testing/eventstore.py)."""

from __future__ import annotations

from aaa_django.events import InMemoryEventStore
from aaa_django.testing.eventstore import EventStoreContract


class TestInMemoryEventStore(EventStoreContract):
    def make_store(self, request):
        return InMemoryEventStore()

    def same_log(self, store):
        return store  # one process, one dict: the same object is the same log

    def test_two_stores_are_two_logs(self, store):
        assert InMemoryEventStore().cache_key != store.cache_key
