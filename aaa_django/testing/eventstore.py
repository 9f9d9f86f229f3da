"""The EventStore contract: every event store passes this one suite.

Subclass :class:`EventStoreContract` in a ``test_*.py`` module (name it ``Test…``) and
fill in the hooks:

    class TestMyStore(EventStoreContract):
        def make_store(self, request):
            return MyStore(...)          # a fresh, empty log

        def same_log(self, store):
            return MyStore(...)          # a second handle on the same log

A backend whose handles are tied to a thread (a database connection) overrides the
``concurrently`` fixture to ask for what its threads need (pytest-django's
``transactional_db``) and ``thread_done`` to release a thread's connections.

The suite drives the async protocol with :func:`run` (``asgiref``'s ``async_to_sync``),
so a Django store's thread-sensitive ORM calls run on the calling thread and see the
test's transaction.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar

import pytest
from asgiref.sync import async_to_sync
from pydantic import BaseModel, Field

from aaa_django.events import (
    ClosedStreamError,
    ConcurrencyError,
    Event,
    EventStore,
    InvalidEventError,
    Projection,
    ReadsFromSnapshot,
    Snapshot,
    encode_json,
    fold,
    iterate,
)

T = TypeVar("T")


def run(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` from sync code (tests have no event loop of their own)."""

    async def main() -> T:
        return await awaitable

    return async_to_sync(main)()


def ev(stream: str = "run-1", type: str = "test.happened", data: Any = None, **kw: Any) -> Event:
    """A root event; ``data`` defaults to ``{}``, ``**kw`` sets any other field."""
    return Event.new(stream, type, {} if data is None else data, **kw)


def raw(**fields: Any) -> Event:
    """An event built field by field, bypassing ``Event.new`` (for malformed input)."""
    base: dict[str, Any] = dict(id=Event.new("x", "a.b").id, stream="run-1", type="aaa.test.happened", data={})
    base.update(fields)
    return Event(**base)


# --- a projection with snapshots, for the failure table ----------------------------


class Tally(BaseModel):
    count: int = 0
    total: int = 0
    last: str = ""
    by_type: dict[str, int] = Field(default_factory=dict)


def apply_tally(state: Tally, e: Event) -> Tally:
    state.count += 1
    state.total += int(e.data.get("n", 0))
    state.last = e.id
    state.by_type[e.type] = state.by_type.get(e.type, 0) + 1
    return state


def tally(version: int = 1, every: int = 4) -> Projection[Tally]:
    """A fresh projection object (its ``folds`` counter starts at 0)."""
    return Projection(Tally, apply_tally, name="test.tally", version=version, state_type=Tally, every=every)


def expected_tally(events: list[Event]) -> Tally:
    state = Tally()
    for e in events:
        state = apply_tally(state, e)
    return state


def _nested(depth: int) -> object:
    value: object = {"leaf": 1}
    for i in range(depth - 1):
        value = [value] if i % 2 else {"k": value}
    return value


class Concurrently:
    """Start ``fns`` in threads at once (a barrier), wait, re-raise the first error."""

    def __init__(self, done: Callable[[], None]) -> None:
        self._done = done

    def __call__(self, *fns: Callable[[], T], timeout: float = 60) -> list[T]:
        barrier = threading.Barrier(len(fns))
        results: list[Any] = [None] * len(fns)
        errors: list[BaseException] = []

        def body(i: int, fn: Callable[[], T]) -> None:
            try:
                barrier.wait(timeout)
                results[i] = fn()
            except BaseException as exc:  # re-raised in the test's thread
                errors.append(exc)
            finally:
                self._done()

        threads = [threading.Thread(target=body, args=(i, fn)) for i, fn in enumerate(fns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in threads), "a thread did not finish"
        if errors:
            raise errors[0]
        return results


class EventStoreContract:
    """Behaviour every :class:`~aaa_django.events.EventStore` must have."""

    # --- hooks -------------------------------------------------------------------

    def make_store(self, request: pytest.FixtureRequest) -> EventStore:
        """A fresh, empty log (use ``request.getfixturevalue`` for fixtures)."""
        raise NotImplementedError

    def same_log(self, store: EventStore) -> EventStore:
        """A second store object over the same log, as another thread would open it."""
        raise NotImplementedError

    def thread_done(self) -> None:
        """Called at the end of every thread the suite starts (close connections)."""

    @pytest.fixture
    def store(self, request: pytest.FixtureRequest) -> EventStore:
        return self.make_store(request)

    @pytest.fixture
    def concurrently(self) -> Concurrently:
        return Concurrently(self.thread_done)

    # --- helpers -----------------------------------------------------------------

    @staticmethod
    def all_events(store: EventStore, stream: str = "run-1") -> list[Event]:
        return run(store.read(stream))

    @staticmethod
    def append(store: EventStore, *events: Any, **kw: int | None) -> list[Event]:
        return run(store.append(list(events), **kw))

    def assert_unchanged(self, store: EventStore, before: list[Event], stream: str = "run-1") -> None:
        after = self.all_events(store, stream)
        assert [(e.seq, e.id) for e in after] == [(e.seq, e.id) for e in before]
        assert run(store.head(stream)) == ((before[-1].seq, before[-1].id) if before else None)

    # --- the protocol ------------------------------------------------------------

    def test_is_an_event_store(self, store: EventStore) -> None:
        assert isinstance(store, EventStore)

    def test_handles_on_the_same_log_share_the_cache_key(self, store: EventStore) -> None:
        # The in-process holder keys states by it: two handles must find each other's.
        assert isinstance(store.cache_key, str) and store.cache_key
        assert self.same_log(store).cache_key == store.cache_key

    def test_an_empty_log_has_no_events_no_head_no_streams(self, store: EventStore) -> None:
        assert self.all_events(store) == []
        assert run(store.head("run-1")) is None
        assert run(store.streams()) == []
        assert run(store.load_snapshot("run-1", "test.tally", 1)) is None

    # --- append: seq, idempotency ------------------------------------------------

    def test_append_assigns_dense_seq_from_1(self, store: EventStore) -> None:
        first = self.append(store, ev(), ev())
        second = self.append(store, ev())
        third = self.append(store, ev(), ev(), ev())

        assert [e.seq for e in first + second + third] == [1, 2, 3, 4, 5, 6]
        assert [e.seq for e in self.all_events(store)] == [1, 2, 3, 4, 5, 6]

    def test_append_returns_the_stored_events(self, store: EventStore) -> None:
        events = [ev(data={"i": i}) for i in range(3)]

        stored = self.append(store, *events)

        assert [(e.id, e.type, e.data) for e in stored] == [(e.id, e.type, e.data) for e in events]
        assert stored == self.all_events(store)

    def test_seq_is_per_stream(self, store: EventStore) -> None:
        self.append(store, ev("run-a"), ev("run-a"))
        stored = self.append(store, ev("run-b"))

        assert stored[0].seq == 1
        assert [e.seq for e in self.all_events(store, "run-a")] == [1, 2]

    def test_appending_nothing_writes_nothing(self, store: EventStore) -> None:
        assert self.append(store) == []
        assert run(store.streams()) == []

    def test_re_appending_a_stored_id_is_absorbed(self, store: EventStore) -> None:
        e = ev(data={"v": 1})
        before = self.append(store, e, ev())

        again = self.append(store, e)

        assert again == []
        self.assert_unchanged(store, before)

    def test_re_appending_a_derived_event_is_absorbed(self, store: EventStore) -> None:
        (root,) = self.append(store, ev(type="aaa.run.started"))
        first = self.append(store, root.derive("aaa.llm.requested", {"n": 1}, key="turn-1"))

        again = self.append(store, root.derive("aaa.llm.requested", {"n": 1}, key="turn-1"))

        assert len(first) == 1 and again == []
        assert [e.type for e in self.all_events(store)] == ["aaa.run.started", "aaa.llm.requested"]

    def test_a_mixed_batch_stores_only_the_new_events(self, store: EventStore) -> None:
        a, b, c, d = ev(), ev(), ev(), ev()
        self.append(store, a, b)

        stored = self.append(store, a, c, b, d)

        assert [(e.id, e.seq) for e in stored] == [(c.id, 3), (d.id, 4)]
        assert [e.id for e in self.all_events(store)] == [a.id, b.id, c.id, d.id]

    def test_duplicates_inside_one_batch_are_stored_once(self, store: EventStore) -> None:
        a, b = ev(), ev()

        stored = self.append(store, a, b, a, b, a)

        assert [(e.id, e.seq) for e in stored] == [(a.id, 1), (b.id, 2)]
        assert len(self.all_events(store)) == 2

    def test_an_id_is_unique_across_streams(self, store: EventStore) -> None:
        e = ev("run-a")
        self.append(store, e)

        # The same id again, now claiming another stream: absorbed, not stored twice.
        assert self.append(store, Event(id=e.id, stream="run-b", type=e.type)) == []
        assert self.all_events(store, "run-b") == []

    # --- append: concurrency errors write nothing --------------------------------

    def test_an_event_claiming_the_next_seq_is_stored(self, store: EventStore) -> None:
        self.append(store, ev())

        stored = self.append(store, raw(seq=2), raw(seq=3))

        assert [e.seq for e in stored] == [2, 3]

    @pytest.mark.parametrize("claimed", [1, 2, 4, 10])
    def test_an_event_claiming_a_wrong_seq_raises_and_writes_nothing(self, store: EventStore, claimed: int) -> None:
        before = self.append(store, ev())

        with pytest.raises(ConcurrencyError):
            # The second event's seq would be 3. The first is fine, but a batch is
            # atomic, so it is not stored either.
            self.append(store, ev(), raw(seq=claimed))

        self.assert_unchanged(store, before)

    def test_a_wrong_seq_on_an_empty_stream_writes_nothing(self, store: EventStore) -> None:
        with pytest.raises(ConcurrencyError):
            self.append(store, raw(seq=2))

        self.assert_unchanged(store, [])
        assert run(store.streams()) == []

    def test_expected_seq_matching_the_head_appends(self, store: EventStore) -> None:
        assert [e.seq for e in self.append(store, ev(), expected_seq=0)] == [1]
        assert [e.seq for e in self.append(store, ev(), ev(), expected_seq=1)] == [2, 3]

    @pytest.mark.parametrize("expected", [0, 1, 3])
    def test_expected_seq_mismatch_raises_and_writes_nothing(self, store: EventStore, expected: int) -> None:
        before = self.append(store, ev(), ev())

        with pytest.raises(ConcurrencyError):
            self.append(store, ev(), ev(), expected_seq=expected)

        self.assert_unchanged(store, before)

    # --- append: a run's stream is closed at both ends --------------------------------

    @staticmethod
    def a_run(stream: str = "run-1", *, ended: bool = True) -> list[Event]:
        events = [ev(stream, "aaa.run.started", id=f"{stream}:start"), ev(stream, "aaa.llm.requested")]
        return events + ([ev(stream, "aaa.run.completed", id=f"{stream}:end")] if ended else [])

    def test_nothing_is_appended_after_a_run_completes(self, store: EventStore) -> None:
        before = self.append(store, *self.a_run())
        for batch in ([ev(type="aaa.tool.completed")], [ev()], [ev(type="aaa.run.completed")]):
            with pytest.raises(ClosedStreamError, match="completed"):
                self.append(store, *batch)
        self.assert_unchanged(store, before)
        # The completion delivered again is absorbed, as any stored id is (stored, or
        # derived again by another process: no seq); not what follows it.
        assert self.append(store, before[-1]) == []
        self.all_events(store)  # (a store may take the head it read for its next append's)
        assert self.append(store, replace(before[-1], seq=None)) == []
        with pytest.raises(ClosedStreamError):
            self.append(store, before[-1], ev())
        self.assert_unchanged(store, before)

    def test_a_batch_that_goes_on_after_its_completion_writes_nothing(self, store: EventStore) -> None:
        with pytest.raises(ClosedStreamError):
            self.append(store, *self.a_run(), ev(type="aaa.tool.completed"))
        self.assert_unchanged(store, [])

    def test_a_run_stream_starts_with_the_run_start(self, store: EventStore) -> None:
        for first in ("aaa.tool.completed", "aaa.cancel.requested", "aaa.run.completed"):
            with pytest.raises(ClosedStreamError, match="aaa.run.started"):
                self.append(store, ev(type=first), ev(type="aaa.run.started"))
        self.assert_unchanged(store, [])
        # Streams of other types are not runs' (and may hold the runtime's types later).
        assert len(self.append(store, ev("acme-1", "acme.thing.happened"), ev("acme-1", "aaa.tool.completed"))) == 2
        assert len(self.append(store, *self.a_run(ended=False))) == 2

    def test_an_erased_run_takes_no_late_result(self, store: EventStore) -> None:
        self.append(store, *self.a_run(ended=False))
        run(store.erase("run-1"))
        with pytest.raises(ClosedStreamError, match="erased"):
            self.append(store, ev(type="aaa.tool.completed"))
        self.assert_unchanged(store, [])
        # Erased, then started again (a run id may be reused once it is gone).
        assert len(self.append(store, *self.a_run())) == 3

    # --- append: bad input writes nothing ------------------------------------------

    BAD_DATA: dict[str, Any] = {
        "a set": {"tags": {"a", "b"}},
        "an object": {"when": object()},
        "a datetime": {"when": datetime(2026, 1, 1, tzinfo=UTC)},
        "bytes": {"raw": b"\x00\x01"},
        "NaN": {"score": math.nan},
        "infinity": {"score": math.inf},
        "NaN nested in a list": {"scores": [1.0, {"x": -math.inf}]},
        "an int key": {1: "one"},
        "a nested int key": {"outer": {"inner": {2: "two"}}},
        "a key in a list": {"items": [{"ok": 1}, {None: "no"}]},
        "a tuple key": {("a", "b"): 1},
        "deep nesting Python cannot encode": {"deep": None},  # filled in below
        "a cycle": {"self": None},  # filled in below
    }
    BAD_DATA_IDS = list(BAD_DATA)

    @pytest.mark.parametrize("case", BAD_DATA_IDS)
    def test_data_that_is_not_json_raises_and_writes_nothing(self, store: EventStore, case: str) -> None:
        data: dict[Any, Any] = self.BAD_DATA[case]
        if case.startswith("deep nesting"):
            nested: object = []
            for _ in range(100_000):
                nested = [nested]
            data = {"deep": nested}
        if case == "a cycle":
            data = {"list": []}
            data["list"].append(data)
        before = self.append(store, ev())

        with pytest.raises(InvalidEventError):
            self.append(store, ev(), raw(data=data))

        self.assert_unchanged(store, before)

    @pytest.mark.parametrize(
        "fields",
        [
            {"type": None},
            {"type": ""},
            {"type": "   "},
            {"type": "started"},
            {"type": "aaa..started"},
            {"type": ".aaa.started"},
            {"type": "aaa.run started"},
            {"type": "x" * 300 + ".y"},
            {"data": ["not", "an", "object"]},
            {"data": "text"},
            {"data": None},
            {"data": 42},
            {"id": ""},
            {"id": None},
            {"id": 7},
            {"stream": ""},
            {"seq": 0},
            {"seq": -1},
            {"seq": "1"},
            {"causation": 5},
            {"tenant": 5},
            {"time": datetime(2026, 1, 1)},
            {"time": "2026-01-01T00:00:00Z"},
        ],
        ids=lambda f: "-".join(f"{k}={v!r}"[:30] for k, v in f.items()),
    )
    def test_a_malformed_event_raises_and_writes_nothing(self, store: EventStore, fields: dict[str, object]) -> None:
        before = self.append(store, ev())

        with pytest.raises(InvalidEventError):
            self.append(store, ev(), raw(**fields))

        self.assert_unchanged(store, before)

    def test_something_that_is_not_an_event_raises(self, store: EventStore) -> None:
        with pytest.raises(InvalidEventError):
            self.append(store, ev(), {"stream": "run-1", "type": "test.happened"})
        assert run(store.streams()) == []

    def test_a_batch_over_two_streams_raises_and_writes_nothing(self, store: EventStore) -> None:
        with pytest.raises(InvalidEventError):
            self.append(store, ev("run-a"), ev("run-b"))

        assert self.all_events(store, "run-a") == [] and self.all_events(store, "run-b") == []
        assert run(store.streams()) == []

    def test_an_invalid_event_after_a_duplicate_still_writes_nothing(self, store: EventStore) -> None:
        e = ev()
        before = self.append(store, e)

        with pytest.raises(InvalidEventError):
            self.append(store, e, ev(), raw(type="nodots"))

        self.assert_unchanged(store, before)

    # --- read, head, streams --------------------------------------------------------

    def test_read_after_and_limit_page_through_the_stream(self, store: EventStore) -> None:
        events = self.append(store, *[ev(data={"i": i}) for i in range(10)])

        assert run(store.read("run-1", after=7)) == events[7:]
        assert run(store.read("run-1", after=2, limit=3)) == events[2:5]
        assert run(store.read("run-1", limit=4)) == events[:4]
        assert run(store.read("run-1", after=10)) == []
        assert run(store.read("run-1", after=99)) == []
        assert run(store.read("run-1", limit=0)) == []
        assert run(store.read("run-1", after=9, limit=5)) == events[9:]

    def test_read_of_an_unknown_stream_is_empty(self, store: EventStore) -> None:
        self.append(store, ev())
        assert run(store.read("no-such-stream")) == []

    def test_read_within_one_tenant(self, store: EventStore) -> None:
        events = self.append(
            store,
            ev(tenant="acme", data={"i": 0}),
            ev(tenant="other", data={"i": 1}),
            ev(data={"i": 2}),
            ev(tenant="acme", data={"i": 3}),
            ev(tenant="acme", data={"i": 4}),
        )

        assert run(store.read("run-1", tenant="acme")) == [events[0], events[3], events[4]]
        assert run(store.read("run-1", tenant="acme", after=1, limit=1)) == [events[3]]
        assert run(store.read("run-1", tenant="nobody")) == []
        assert run(store.read("run-1")) == events  # no tenant: every event

    def test_iterate_and_fold_page_from_a_seq_within_a_tenant(self, store: EventStore) -> None:
        self.append(store, *[ev(data={"n": i}, tenant="t" if i % 2 else None) for i in range(25)])
        p = tally()

        seen = run(_collect(iterate(store, "run-1", after=3, tenant="t", page_size=4)))
        state = run(fold(p, store, "run-1", after=3, tenant="t"))

        assert [e.seq for e in seen] == list(range(4, 26, 2))
        assert state.count == len(seen) and state.total == sum(range(3, 25, 2))

    def test_head_is_the_last_seq_and_id(self, store: EventStore) -> None:
        *_, last = self.append(store, ev(), ev(), ev())
        self.append(store, ev("run-other"))

        assert run(store.head("run-1")) == (3, last.id)
        assert run(store.head("nothing")) is None

    def test_streams_lists_each_stream_once(self, store: EventStore) -> None:
        for s in ("run-b", "run-a", "run-b", "run-c"):
            self.append(store, ev(s))

        assert sorted(run(store.streams())) == ["run-a", "run-b", "run-c"]
        assert len(run(store.streams())) == 3

    # --- round trips ----------------------------------------------------------------

    ROUND_TRIP_DATA = {
        "nested": {"a": {"b": [1, 2, {"c": None, "d": [True, False]}]}, "e": []},
        "empty": {},
        "unicode": {"text": 'Grüße, 世界 🌍 — ‘quotes’ \\ " \n\t', "ключ": "значение"},
        "big ints": {"big": 2**70, "neg": -(2**63) - 1, "max64": 2**63 - 1, "zero": 0},
        "floats": {
            "third": 1 / 3,
            "tiny": 5e-324,
            "huge": 1.7976931348623157e308,
            "tenth": 0.1,
            "whole": 2.0,
            "exp": 1e20,
            "neg": -2.5e-10,
        },
        "key order": {"zeta": 1, "alpha": 2, "mid": {"z": 1, "a": 2, "m": 3}, "b": 4, "aa": 5},
        "NUL in a string": {"text": "before\u0000after"},
        "long text": {"text": "x" * 100_000},
        "nested 200 deep": {"deep": _nested(200)},
    }

    @pytest.mark.parametrize("case", list(ROUND_TRIP_DATA))
    def test_data_round_trips_exactly(self, store: EventStore, case: str) -> None:
        # Exactly: same values, same types (2.0 stays a float, 2**70 an int) and the same
        # key order, so a fold gives the same state on every backend.
        data = self.ROUND_TRIP_DATA[case]

        (stored,) = self.append(store, ev(data=data))
        (read,) = self.all_events(store)

        for got in (stored.data, read.data):
            assert got == data
            assert encode_json(got) == encode_json(data)

    def test_fields_round_trip(self, store: EventStore) -> None:
        cause = ev()
        when = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=timezone(timedelta(hours=2)))
        e = ev(type="acme.order.placed", data={"n": 1}, causation=cause.id, tenant="acme")
        e = Event(**{**_fields(e), "time": when})

        (stored,) = self.append(store, e)
        (read,) = self.all_events(store)

        for got in (stored, read):
            assert (got.id, got.stream, got.seq, got.type) == (e.id, "run-1", 1, "acme.order.placed")
            assert got.causation == cause.id and got.tenant == "acme"
            assert got.time == when  # the same instant, to the microsecond
            assert got.time.tzinfo is not None
            assert got.blobs == ()

    def test_the_default_time_is_now_and_tz_aware(self, store: EventStore) -> None:
        before = datetime.now(UTC)
        self.append(store, ev())
        (read,) = self.all_events(store)

        assert read.time.tzinfo is not None
        assert before - timedelta(seconds=1) <= read.time <= datetime.now(UTC)

    def test_blob_refs_round_trip(self, store: EventStore) -> None:
        refs_module = pytest.importorskip("aaa_django.data.refs")
        BlobRef = refs_module.BlobRef
        refs = (
            BlobRef.for_bytes(b"payload", "application/json", namespace="run-1"),
            BlobRef.for_bytes(b"", namespace=""),
        )
        e = ev(data={"$claim": True, "tag": "t"}, blobs=refs)

        (stored,) = self.append(store, e)
        (read,) = self.all_events(store)

        assert stored.blobs == refs and read.blobs == refs
        assert all(isinstance(r, BlobRef) for r in read.blobs)

    def test_mutating_the_callers_data_after_append_changes_nothing(self, store: EventStore) -> None:
        data: dict[str, Any] = {"items": [1, 2], "inner": {"k": "v"}}
        e = ev(data=data)
        self.append(store, e)

        data["items"].append(3)
        data["inner"]["k"] = "changed"
        data["new"] = True

        (read,) = self.all_events(store)
        assert read.data == {"items": [1, 2], "inner": {"k": "v"}}

    # --- snapshots --------------------------------------------------------------------

    def snap(
        self,
        seq: int = 1,
        *,
        stream: str = "run-1",
        name: str = "test.tally",
        version: int = 1,
        event_id: str = "e",
        state: str = '{"count":1}',
    ) -> Snapshot:
        return Snapshot(stream, name, version, seq, event_id, state)

    def test_a_snapshot_round_trips_exactly(self, store: EventStore) -> None:
        # The state text comes back byte for byte: a dict's key order is part of a
        # state (folds iterate dicts), and a reformatted text would not be equal.
        s = self.snap(3, event_id="ev-3", state='{"z":1,"a":[1.0,2],"ü":"✓","m":{"b":1,"a":2}}')

        assert run(store.save_snapshot(s)) is True
        assert run(store.load_snapshot("run-1", "test.tally", 1)) == s

    def test_snapshots_are_keyed_by_stream_name_and_version(self, store: EventStore) -> None:
        s = self.snap(2)
        run(store.save_snapshot(s))
        other = [
            self.snap(5, stream="run-2", state='{"count":5}'),
            self.snap(6, name="test.other", state='{"count":6}'),
            self.snap(7, version=2, state='{"count":7}'),
        ]
        for o in other:
            assert run(store.save_snapshot(o)) is True

        assert run(store.load_snapshot("run-1", "test.tally", 1)) == s
        for o in other:
            assert run(store.load_snapshot(o.stream, o.name, o.version)) == o
        assert run(store.load_snapshot("run-1", "test.tally", 3)) is None
        assert run(store.load_snapshot("run-1", "test.nothing", 1)) is None

    def test_a_newer_snapshot_replaces_an_older_one(self, store: EventStore) -> None:
        run(store.save_snapshot(self.snap(3)))
        newer = self.snap(9, event_id="e9", state='{"count":9}')

        assert run(store.save_snapshot(newer)) is True
        assert run(store.load_snapshot("run-1", "test.tally", 1)) == newer

    @pytest.mark.parametrize("seq", [1, 4], ids=["older", "equal"])
    def test_an_older_or_equal_snapshot_never_replaces_a_newer_one(self, store: EventStore, seq: int) -> None:
        newer = self.snap(4, event_id="e4", state='{"count":4}')
        run(store.save_snapshot(newer))

        assert run(store.save_snapshot(self.snap(seq, event_id="x", state='{"count":0}'))) is False
        assert run(store.load_snapshot("run-1", "test.tally", 1)) == newer

    @staticmethod
    def reads_from_snapshot(store: EventStore) -> ReadsFromSnapshot:
        if not isinstance(store, ReadsFromSnapshot):
            pytest.skip("an optional capability (ReadsFromSnapshot) this store lacks")
        return store

    def test_a_snapshot_is_read_with_the_log_from_its_seq_on(self, store: EventStore) -> None:
        reads = self.reads_from_snapshot(store)
        events = self.append(store, *(ev() for _ in range(5)))
        saved = self.snap(3, event_id=events[2].id, state='{"count":3}')
        run(store.save_snapshot(saved))

        assert run(reads.read_from_snapshot("run-1", "test.tally", 1)) == (saved, events[2:])
        assert run(reads.read_from_snapshot("run-1", "test.tally", 2)) == (None, [])
        assert run(reads.read_from_snapshot("run-2", "test.tally", 1)) == (None, [])

    def test_a_snapshot_without_its_events_is_read_alone(self, store: EventStore) -> None:
        reads = self.reads_from_snapshot(store)
        saved = self.snap(3, stream="run-9", event_id="gone", state='{"count":3}')
        run(store.save_snapshot(saved))  # (a log written since, shorter: none of it there)

        assert run(reads.read_from_snapshot("run-9", "test.tally", 1)) == (saved, [])

    def test_concurrent_savers_keep_the_newest(self, store: EventStore, concurrently: Concurrently) -> None:
        for round_ in range(6):
            stream = f"run-{round_}"
            seqs = [3, 17, 8, 12] if round_ % 2 else [17, 3, 12, 8]
            handles = [self.same_log(store) for _ in seqs]

            def saver(h: EventStore, seq: int, stream: str = stream) -> Callable[[], bool]:
                return lambda: run(
                    h.save_snapshot(self.snap(seq, stream=stream, event_id=f"e{seq}", state=f'{{"count":{seq}}}'))
                )

            results = concurrently(*(saver(h, s) for h, s in zip(handles, seqs)))

            kept = run(store.load_snapshot(stream, "test.tally", 1))
            assert kept == self.snap(17, stream=stream, event_id="e17", state='{"count":17}')
            assert results[seqs.index(17)] is True

    # --- erase ------------------------------------------------------------------------

    def test_erase_removes_the_streams_events_and_snapshots_only(self, store: EventStore) -> None:
        kept = self.append(store, ev("run-keep"), ev("run-keep"))
        gone = self.append(store, ev("run-gone"), ev("run-gone"), ev("run-gone"))
        run(store.save_snapshot(self.snap(2, stream="run-keep")))
        run(store.save_snapshot(self.snap(3, stream="run-gone")))
        run(store.save_snapshot(self.snap(3, stream="run-gone", name="test.other")))

        assert run(store.erase("run-gone")) == 3

        assert self.all_events(store, "run-gone") == [] and run(store.head("run-gone")) is None
        assert run(store.load_snapshot("run-gone", "test.tally", 1)) is None
        assert run(store.load_snapshot("run-gone", "test.other", 1)) is None
        assert run(store.streams()) == ["run-keep"]
        assert self.all_events(store, "run-keep") == kept
        assert run(store.load_snapshot("run-keep", "test.tally", 1)) == self.snap(2, stream="run-keep")
        assert gone  # (the erased events were stored)

    def test_erasing_an_unknown_stream_erases_nothing(self, store: EventStore) -> None:
        self.append(store, ev())
        assert run(store.erase("nothing")) == 0
        assert len(self.all_events(store)) == 1

    def test_erased_ids_can_be_appended_again_from_seq_1(self, store: EventStore) -> None:
        a, b = ev(data={"v": "old"}), ev(data={"v": "old"})
        self.append(store, ev(), a, b)
        run(store.erase("run-1"))

        stored = self.append(store, Event(**{**_fields(b), "data": {"v": "new"}}), a)

        assert [(e.id, e.seq) for e in stored] == [(b.id, 1), (a.id, 2)]
        assert [e.data for e in self.all_events(store)] == [{"v": "new"}, {"v": "old"}]

    # --- Projection.load on this store: the failure table ----------------------------

    def log_of(self, store: EventStore, n: int, stream: str = "run-1") -> list[Event]:
        return self.append(store, *[ev(stream, data={"n": i}) for i in range(n)])

    def test_load_without_a_snapshot_replays(self, store: EventStore) -> None:
        events = self.log_of(store, 10)
        p = tally(every=100)

        info = run(p.load_info(store, "run-1"))

        assert (info.source, info.seq, info.base_seq, info.folded) == ("replay", 10, 0, 10)
        assert p.folds == 10 and info.state == expected_tally(events)

    def test_load_saves_a_snapshot_then_folds_only_the_tail(self, store: EventStore) -> None:
        events = self.log_of(store, 10)
        p = tally(every=4)

        first = run(p.load_info(store, "run-1"))
        snap = run(store.load_snapshot("run-1", "test.tally", 1))
        events += self.log_of(store, 3)
        second = run(p.load_info(store, "run-1"))

        assert first.source == "replay" and snap is not None
        assert (snap.seq, snap.event_id) == (10, events[9].id)
        assert (second.source, second.base_seq, second.folded, second.seq) == ("snapshot", 10, 3, 13)
        assert p.folds == 13 and second.state == expected_tally(events)

    def test_load_of_an_empty_stream_is_the_initial_state(self, store: EventStore) -> None:
        info = run(tally().load_info(store, "run-1"))
        assert (info.source, info.seq, info.folded) == ("replay", 0, 0)
        assert info.state == Tally()

    def plant(
        self,
        store: EventStore,
        events: list[Event],
        *,
        seq: int | None = None,
        event_id: str | None = None,
        state: str | None = None,
        version: int = 1,
    ) -> None:
        """Put a snapshot at ``seq`` (default: the log's end) behind the projection."""
        seq = len(events) if seq is None else seq
        if event_id is None:
            event_id = events[seq - 1].id if seq <= len(events) else "not-in-this-log"
        if state is None:
            state = tally().dump(expected_tally(events[:seq]))
        run(store.save_snapshot(Snapshot("run-1", "test.tally", version, seq, event_id, state)))

    def test_load_from_a_valid_snapshot_folds_the_tail(self, store: EventStore) -> None:
        events = self.log_of(store, 12)
        self.plant(store, events, seq=9)
        p = tally(every=100)

        info = run(p.load_info(store, "run-1"))

        assert (info.source, info.base_seq, info.folded) == ("snapshot", 9, 3)
        assert p.folds == 3 and info.state == expected_tally(events)

    @pytest.mark.parametrize(
        "text",
        ['{"count": 3, "total"', "not json at all", "", '{"count": "three"}', "[]", "null"],
        ids=["truncated", "not-json", "empty", "wrong-type", "a-list", "null"],
    )
    def test_load_with_a_corrupt_snapshot_replays_and_logs(
        self, store: EventStore, caplog: pytest.LogCaptureFixture, text: str
    ) -> None:
        events = self.log_of(store, 12)
        self.plant(store, events, seq=9, state=text)
        p = tally(every=100)

        with caplog.at_level(logging.INFO, logger="aaa_django.events"):
            info = run(p.load_info(store, "run-1"))

        assert (info.source, info.folded) == ("replay", 12)
        assert p.folds == 12 and info.state == expected_tally(events)
        assert any(
            r.name.startswith("aaa_django") and r.levelno >= logging.WARNING and "corrupt" in r.getMessage()
            for r in caplog.records
        )

    def test_load_with_another_versions_snapshot_replays(self, store: EventStore) -> None:
        events = self.log_of(store, 12)
        self.plant(store, events, seq=9, version=1)
        p = tally(version=2, every=100)

        info = run(p.load_info(store, "run-1"))

        assert (info.source, info.folded) == ("replay", 12)
        assert p.folds == 12 and info.state == expected_tally(events)

    @pytest.mark.parametrize("ahead", [1, 50])
    def test_load_with_a_snapshot_ahead_of_the_log_replays(self, store: EventStore, ahead: int) -> None:
        # A snapshot saved for a longer log (forged, or left over from another writer).
        events = self.log_of(store, 6)
        self.plant(store, events, seq=6 + ahead, event_id="some-later-event", state=tally().dump(Tally(count=999)))
        p = tally(every=100)

        info = run(p.load_info(store, "run-1"))

        assert (info.source, info.folded, info.seq) == ("replay", 6, 6)
        assert p.folds == 6 and info.state == expected_tally(events)

    def test_load_after_erase_and_a_shorter_rewrite_replays(self, store: EventStore) -> None:
        # The longer log's snapshot survives only if a store forgets to erase it; plant
        # it again after the erase, as a stale writer would.
        old = self.log_of(store, 20)
        run(tally(every=4).load_info(store, "run-1"))
        stale = run(store.load_snapshot("run-1", "test.tally", 1))
        assert stale is not None
        run(store.erase("run-1"))
        assert run(store.load_snapshot("run-1", "test.tally", 1)) is None
        new = self.log_of(store, 7)
        run(store.save_snapshot(stale))
        p = tally(every=100)

        info = run(p.load_info(store, "run-1"))

        assert stale.seq == 20 and old
        assert (info.source, info.folded) == ("replay", 7)
        assert info.state == expected_tally(new)

    def test_load_with_a_snapshot_from_another_log_replays(self, store: EventStore) -> None:
        # Same stream and seq, but the event at that seq is not the one it was folded on.
        events = self.log_of(store, 12)
        self.plant(store, events, seq=9, event_id=ev().id, state=tally().dump(Tally(count=999)))
        p = tally(every=100)

        info = run(p.load_info(store, "run-1"))

        assert (info.source, info.folded) == ("replay", 12)
        assert p.folds == 12 and info.state == expected_tally(events)

    def test_load_as_of_an_event(self, store: EventStore) -> None:
        events = self.log_of(store, 12)
        self.plant(store, events, seq=5)
        p = tally(every=100)

        later = run(p.load_info(store, "run-1", at=8))
        earlier = run(p.load_info(store, "run-1", at=3))

        assert (later.source, later.seq, later.folded) == ("snapshot", 8, 3)
        assert later.state == expected_tally(events[:8])
        assert (earlier.source, earlier.seq) == ("replay", 3)
        assert earlier.state == expected_tally(events[:3])

    # --- concurrency ----------------------------------------------------------------

    def test_concurrent_appenders_get_dense_seqs_and_lose_nothing(
        self, store: EventStore, concurrently: Concurrently
    ) -> None:
        # Append without expected_seq serialises appenders itself: no appender sees a
        # ConcurrencyError to retry (any exception fails this test).
        writers, each = 12, 20
        handles = [self.same_log(store) for _ in range(writers)]
        sent: list[list[str]] = [[] for _ in range(writers)]

        def writer(w: int) -> Callable[[], None]:
            def body() -> None:
                for i in range(each):
                    batch = [ev(data={"w": w, "i": i})] if i % 3 else [ev(data={"w": w}), ev()]
                    stored = run(handles[w].append(batch))
                    assert [e.id for e in stored] == [e.id for e in batch]
                    sent[w] += [e.id for e in batch]

            return body

        concurrently(*(writer(w) for w in range(writers)))

        events = self.all_events(store)
        ids = [e.id for e in events]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert len(ids) == len(set(ids)) == sum(len(s) for s in sent)
        assert set(ids) == {i for s in sent for i in s}
        for s in sent:  # each writer's events are in its own order
            assert [i for i in ids if i in set(s)] == s

    def test_concurrent_appends_of_the_same_event_store_it_once(
        self, store: EventStore, concurrently: Concurrently
    ) -> None:
        for round_ in range(5):
            stream = f"run-{round_}"
            (root,) = self.append(store, ev(stream, type="aaa.run.started"))
            derived = root.derive("aaa.llm.requested", {"turn": 1}, key="t1")
            handles = [self.same_log(store) for _ in range(4)]

            results = concurrently(*(lambda h=h, d=derived: run(h.append([d])) for h in handles))

            assert sorted(len(r) for r in results) == [0, 0, 0, 1]
            assert [e.id for e in self.all_events(store, stream)] == [root.id, derived.id]

    def test_concurrent_expected_seq_appends_let_exactly_one_win(
        self, store: EventStore, concurrently: Concurrently
    ) -> None:
        self.append(store, ev())
        handles = [self.same_log(store) for _ in range(4)]

        def attempt(h: EventStore) -> Callable[[], list[Event] | None]:
            def body() -> list[Event] | None:
                try:
                    return run(h.append([ev(), ev()], expected_seq=1))
                except ConcurrencyError:
                    return None

            return body

        results = concurrently(*(attempt(h) for h in handles))

        winners = [r for r in results if r is not None]
        assert len(winners) == 1 and [e.seq for e in winners[0]] == [2, 3]
        assert [e.seq for e in self.all_events(store)] == [1, 2, 3]


async def _collect(aiter: AsyncIterable[T]) -> list[T]:
    return [x async for x in aiter]


def _fields(e: Event) -> dict[str, Any]:
    return {f: getattr(e, f) for f in Event.__dataclass_fields__}
