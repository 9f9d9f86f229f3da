"""The in-process holder on the Django store: it shares only states folded from
committed rows (ADR: never publish a state that may hold a caller's uncommitted rows)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction

from aaa_django.events import Event, FoldCache, Projection
from aaa_django.store import DjangoEventStore


def _count(state: dict, event: Event) -> dict:
    state["n"] = state.get("n", 0) + 1
    return state


COUNT = Projection(dict, _count, name="test.count", version=1, state_type=dict, every=1000)


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_holder_publishes_committed_reads(db_alias):
    store, cache = DjangoEventStore(db_alias), FoldCache(check_every=0)
    store.append_sync([Event.new("h", "test.e", {}) for _ in range(5)])
    first = async_to_sync(COUNT.load_info)(store, "h", cache=cache)
    assert (first.source, first.state, len(cache)) == ("replay", {"n": 5}, 1)
    store.append_sync([Event.new("h", "test.e", {})])
    second = async_to_sync(COUNT.load_info)(store, "h", cache=cache)
    assert (second.source, second.folded, second.state) == ("cache", 1, {"n": 6})


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_holder_never_shares_uncommitted_rows(db_alias):
    store, cache = DjangoEventStore(db_alias), FoldCache(check_every=0)
    store.append_sync([Event.new("u", "test.e", {}) for _ in range(3)])
    async_to_sync(COUNT.load)(store, "u", cache=cache)  # committed: published at seq 3

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback):
        with transaction.atomic(using=db_alias):
            store.append_sync([Event.new("u", "test.e", {}) for _ in range(2)])
            inside = async_to_sync(COUNT.load_info)(store, "u", cache=cache)
            assert inside.state == {"n": 5}  # the caller sees its own rows...
            raise Rollback
    # ...but nobody else ever saw them: the holder still stands at seq 3.
    assert cache.get(("django:" + db_alias, "u", "test.count", 1)).cursor == 3
    after = async_to_sync(COUNT.load_info)(store, "u", cache=cache)
    assert (after.state, after.seq) == ({"n": 3}, 3)
