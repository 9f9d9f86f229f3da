"""An append costs the same number of queries at event 10 and at event 1,000, on a run
stream (indexed) and on any other stream: nothing in the append path reads the log."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from aaa_django.events import Event
from aaa_django.runtime.event_types import RUN_STARTED
from aaa_django.store import DjangoEventStore

pytestmark = pytest.mark.django_db(databases="__all__")


def _queries_of_one_append(alias: str, store: DjangoEventStore, stream: str, type: str, i: int) -> int:
    with CaptureQueriesContext(connections[alias]) as ctx:
        store.append_sync([Event.new(stream, type, {"i": i})])
    return len(ctx.captured_queries)


@pytest.mark.parametrize("kind", ["run", "plain"])
def test_append_queries_do_not_grow_with_the_stream(db_alias, kind):
    store = DjangoEventStore(db_alias)
    stream = f"{kind}-long"
    # a run's stream starts with its start; a plain stream holds types of its own
    type = "aaa.llm.requested" if kind == "run" else "acme.note.made"
    if kind == "run":
        store.append_sync([Event.new(stream, RUN_STARTED, {"algorithm": "x", "input": {}})])
    store.append_sync([Event.new(stream, type, {"i": i}) for i in range(9)])
    early = _queries_of_one_append(db_alias, store, stream, type, 10)
    for start in range(10, 1000, 200):
        store.append_sync([Event.new(stream, type, {"i": i}) for i in range(start, start + 200)])
    late = _queries_of_one_append(db_alias, store, stream, type, 1001)
    assert late == early
    assert early <= 8  # savepoint/transaction, head + known ids, insert, the run index
