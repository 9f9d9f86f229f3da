"""The store's plain statements on PostgreSQL go through Django's cursor: a site's
execute wrappers and query logging see them as any other."""

from __future__ import annotations

import pytest
from django.db import connections

from aaa_django.events import Event
from aaa_django.runtime.event_types import RUN_STARTED
from aaa_django.store import DjangoEventStore

pytestmark = [pytest.mark.django_db(databases=["postgres"], transaction=True), pytest.mark.postgres]


def _run(stream: str) -> list[Event]:
    return [
        Event.new(stream, RUN_STARTED, {"algorithm": "x", "input": {}}),
        *(Event.new(stream, "aaa.llm.requested", {"i": i}) for i in range(3)),
    ]


def test_execute_wrappers_and_the_query_log_see_the_stores_statements(pg_alias):
    conn = connections[pg_alias]
    store, events = DjangoEventStore(pg_alias), _run("run-seen")
    store.append_sync(events[:2])
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with conn.execute_wrapper(record):
        store.append_sync(events[2:3])
    assert [s.split("(")[0] for s in seen] == ["SELECT aaa_append_event"]

    conn.force_debug_cursor = True
    try:
        conn.queries_log.clear()
        store.append_sync(events[3:4])
        logged = [q["sql"] for q in conn.queries]
    finally:
        conn.force_debug_cursor = False
    assert len(logged) == 1 and logged[0].startswith("SELECT aaa_append_event(")
