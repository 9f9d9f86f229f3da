"""Events as the store reads them from rows: every field as appended, whichever way
the read went (a plain read, the snapshot read, PostgreSQL's read to the head), and
the data of a page decoded at once without mixing up rows."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import pytest

from aaa_django.events import Event, Snapshot
from aaa_django.store import DjangoEventStore, site_store
from aaa_django.store.rows import loads, to_events

pytestmark = pytest.mark.django_db(databases="__all__")

WHEN = {
    "on the second": datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc),
    "to the microsecond": datetime(2026, 12, 1, 10, 0, 0, 7, tzinfo=timezone.utc),
}


@pytest.mark.django_db(databases="__all__", transaction=True)  # (the site's store: its own connections)
@pytest.mark.parametrize("when", list(WHEN), ids=list(WHEN))
def test_times_read_back_as_appended_on_every_read(db_alias, when):
    """A time is stored as naive UTC (SQLite's text, PostgreSQL's timestamptz) and read
    as text the store parses itself (rows.event_columns): an aware UTC datetime, equal
    to the appended one, with or without microseconds."""
    store = DjangoEventStore(db_alias)
    awaited = site_store(db_alias)  # PostgreSQL's read to the head (with the run's row)
    appended = [
        Event(**{**vars_of(Event.new("timed", "acme.note.made", {"i": i})), "time": WHEN[when]}) for i in range(3)
    ]
    stored = store.append_sync(appended)
    store.save_snapshot_sync(Snapshot("timed", "test.t", 1, 2, stored[1].id, "{}"))

    reads = {
        "read": store.read_sync("timed"),
        "read to the head": asyncio.run(awaited.read("timed")),
        "snapshot read": [None, *store.read_from_snapshot_sync("timed", "test.t", 1)[1]],
    }

    for how, events in reads.items():
        for e, a in zip(events[1:], stored[1:]):
            assert e == a, how
            assert e.time == WHEN[when] and e.time.utcoffset().total_seconds() == 0, how


def vars_of(e: Event) -> dict:
    return {name: getattr(e, name) for name in e.__dataclass_fields__}


def _row(seq: int, text: str) -> tuple:
    return (f"e{seq}", "s", seq, "acme.note.made", text, None, "2026-12-01 10:00:00", "[]", None)


def test_a_page_of_rows_is_decoded_at_once_each_row_its_own_data():
    rows = [_row(i, json.dumps({"i": i})) for i in range(1, 4)]

    assert [e.data for e in to_events(rows)] == [{"i": 1}, {"i": 2}, {"i": 3}]


def test_a_text_that_is_not_one_value_fails_the_read_rather_than_shift_the_rows():
    """The page's texts go into one JSON array: a row holding two values would push every
    later row's data one place on. The count is checked, and each row then decoded alone
    (which refuses the bad one)."""
    rows = [_row(1, '{"i": 1}, {"i": 99}'), _row(2, '{"i": 2}')]

    with pytest.raises(json.JSONDecodeError):
        to_events(rows)


DEEP = "[" * 300 + "]" * 300  # past pydantic-core's depth limit, within json's


@pytest.mark.parametrize(
    "text",
    [
        '{"big": 18446744073709551616, "negative": -9223372036854775809}',  # past 64 bits
        '{"f": 0.1, "tiny": 5e-324, "max": 1.7976931348623157e308, "z": -0.0, "e": 1E5}',
        '{"inf": 1e400}',
        '{"b": 1, "a": 2, "b": 3}',  # key order, and the last of a repeated key
        '{"s": "\\u00e9\\n\\u0000", "raw": "é"}',
        '{"lone": "\\ud800"}',  # an escaped lone surrogate: json's, pydantic-core refuses it
        DEEP,
    ],
    ids=["big ints", "floats", "inf", "keys", "strings", "lone surrogate", "deep"],
)
def test_data_decodes_as_json_loads_does(text):
    assert repr(loads(text)) == repr(json.loads(text))


def test_text_that_is_not_json_raises_json_s_error():
    with pytest.raises(json.JSONDecodeError):
        loads('{"i": 1')
