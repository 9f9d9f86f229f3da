"""Folding any split of any log gives the whole-log fold's state (core, memory store).

For random logs (event types from a small alphabet, random data) and three kinds of
projection — a pydantic state with snapshots, a plain dict without a state type, one
with ``finalize`` — every faster path must equal the reference, the whole-log
``fold()``: ``Projection.fold`` in two pieces, a snapshot plus its tail, and the
in-process holder read at random points. Then the holder's guards: a reader with an
older view never gets a state from the future, an entry from another log is rejected,
and the self-check replaces a wrong entry with the whole-log state.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from aaa_django.events import (
    Event,
    FoldCache,
    Folded,
    InMemoryEventStore,
    Projection,
    Snapshot,
    fold,
)

STREAM = "run-1"
# Not the runtime's ``aaa.`` types: a stream of those is a run's, which starts with its start.
TYPES = [
    "test.run.started",
    "test.llm.requested",
    "test.llm.completed",
    "test.tool.requested",
    "test.tool.completed",
    "acme.unknown.happened",  # folds must ignore types they do not know
]

# --- three projections -------------------------------------------------------------


class Stats(BaseModel):
    """A pydantic state: counters, an order-sensitive trail, a dict (key order kept)."""

    counts: dict[str, int] = Field(default_factory=dict)
    total: int = 0
    trail: list[str] = Field(default_factory=list)  # the last 5 types, in order
    pending: list[str] = Field(default_factory=list)
    last_tag: str = ""


def apply_stats(s: Stats, e: Event) -> Stats:
    s.counts[e.type] = s.counts.get(e.type, 0) + 1
    s.total += e.data.get("n", 0)
    s.trail = (s.trail + [e.type.split(".")[1]])[-5:]
    if e.type == "test.tool.requested":
        s.pending.append(e.data.get("call", ""))
    elif e.type == "test.tool.completed" and e.data.get("call", "") in s.pending:
        s.pending.remove(e.data.get("call", ""))
    if "tag" in e.data:
        s.last_tag = e.data["tag"]
    return s


def apply_plain(s: dict, e: Event) -> dict:
    if e.type.startswith("test."):
        s["types"].append(e.type)
        s["n"] = s["n"] * 31 + e.data.get("n", 0)  # order-sensitive
    return s


class Pairs(BaseModel):
    requested: dict[str, int] = Field(default_factory=dict)  # call -> seq
    completed: dict[str, int] = Field(default_factory=dict)
    matched: list[str] = Field(default_factory=list)  # filled by finalize only


def apply_pairs(s: Pairs, e: Event) -> Pairs:
    call = e.data.get("call", "")
    if e.type == "test.tool.requested":
        s.requested.setdefault(call, e.seq)
    elif e.type == "test.tool.completed":
        s.completed[call] = e.seq
    return s


def finalize_pairs(s: Pairs) -> Pairs:
    # Cross-row resolution after the fold: lifecycle pairs matched by call id, sorted.
    s.matched = sorted(c for c in s.requested if c in s.completed and s.completed[c] > s.requested[c])
    return s


def stats_projection(every: int = 5) -> Projection:
    return Projection(Stats, apply_stats, name="prop.stats", version=1, state_type=Stats, every=every)


def plain_projection() -> Projection:
    return Projection({"types": [], "n": 0}, apply_plain)


def pairs_projection(every: int = 5) -> Projection:
    return Projection(
        Pairs,
        apply_pairs,
        name="prop.pairs",
        version=1,
        state_type=Pairs,
        every=every,
        finalize=finalize_pairs,
    )


PROJECTIONS = {"stats": stats_projection, "plain": plain_projection, "pairs": pairs_projection}
WITH_SNAPSHOTS = ["stats", "pairs"]


def canon(p: Projection, state):
    """A comparable form: the JSON text for typed states (key order included)."""
    if isinstance(state, BaseModel):
        return state.model_dump_json()
    return state


# --- random logs -----------------------------------------------------------------------

data_st = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(-1000, 1000),
        "tag": st.text(max_size=4),
        "call": st.sampled_from(["c1", "c2", "c3", "c4"]),
        "extra": st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=3),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
            max_leaves=5,
        ),
    },
)
log_st = st.lists(st.tuples(st.sampled_from(TYPES), data_st), max_size=40)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


async def write(store, spec, stream: str = STREAM) -> list[Event]:
    return await store.append([Event.new(stream, t, d) for t, d in spec]) if spec else []


def reference(p: Projection, events: list[Event]):
    """The whole-log fold, with a fresh projection object (it counts folds)."""
    return p.result(p.fold(events))


# --- every split equals the whole log -------------------------------------------------


@pytest.mark.parametrize("kind", list(PROJECTIONS))
@SETTINGS
@given(spec=log_st, data=st.data())
def test_every_split_equals_the_whole_log_fold(kind, spec, data):
    make = PROJECTIONS[kind]

    async def body():
        store = InMemoryEventStore()
        events = await write(store, spec)
        p = make()
        whole = await fold(p, store, STREAM)
        assert canon(p, whole) == canon(p, reference(make(), events))

        # Projection.fold in two pieces, at any split point.
        k = data.draw(st.integers(0, len(events)), label="split")
        two = p.result(p.fold(events[k:], p.fold(events[:k])))
        assert canon(p, two) == canon(p, whole)

        # The whole-log fold from a seq equals folding that suffix.
        after = data.draw(st.integers(0, len(events)), label="after")
        assert canon(p, await fold(p, store, STREAM, after=after)) == canon(p, reference(make(), events[after:]))

        # Projection.load without any cache or snapshot is the same fold.
        assert canon(p, await make().load(store, STREAM)) == canon(p, whole)

    asyncio.run(body())


@pytest.mark.parametrize("kind", WITH_SNAPSHOTS)
@SETTINGS
@given(spec=log_st.filter(bool), data=st.data())
def test_a_snapshot_plus_its_tail_equals_the_whole_log_fold(kind, spec, data):
    make = PROJECTIONS[kind]

    async def body():
        store = InMemoryEventStore()
        events = await write(store, spec)
        k = data.draw(st.integers(1, len(events)), label="snapshot at")
        p = make(every=10_000)
        state = p.fold(events[:k])
        await store.save_snapshot(Snapshot(STREAM, p.name, p.version, k, events[k - 1].id, p.dump(state)))

        info = await p.load_info(store, STREAM)

        assert (info.source, info.base_seq, info.folded) == ("snapshot", k, len(events) - k)
        assert canon(p, info.state) == canon(p, reference(make(), events))

    asyncio.run(body())


@pytest.mark.parametrize("kind", list(PROJECTIONS))
@SETTINGS
@given(spec=log_st, data=st.data())
def test_the_holder_read_at_random_points_equals_the_whole_log_fold(kind, spec, data):
    """Append the log in random chunks, read through the holder after each: every read
    equals the whole-log fold of what is there, and each event is folded once."""
    make = PROJECTIONS[kind]

    async def body():
        store = InMemoryEventStore()
        cache = FoldCache(check_every=7, idle_after=0)  # its self-checks at once, beside the reads
        p = make(every=data.draw(st.integers(1, 8), label="every")) if kind in WITH_SNAPSHOTS else make()
        events: list[Event] = []
        folded = 0
        rest = list(spec)
        while rest:
            n = data.draw(st.integers(1, len(rest)), label="chunk")
            events += await write(store, rest[:n])
            rest = rest[n:]
            info = await p.load_info(store, STREAM, cache=cache)
            folded += info.folded
            assert info.seq == len(events)
            assert canon(p, info.state) == canon(p, reference(make(), events))
        await cache.wait_checks()
        assert folded == len(events) == p.folds
        assert cache.rejected == 0 and cache.resets == 0

    asyncio.run(body())


# --- the holder's guards ----------------------------------------------------------------


class OlderView:
    """The same log seen by a reader whose transaction began earlier: events after
    ``visible`` are not in its view."""

    def __init__(self, store: InMemoryEventStore, visible: int) -> None:
        self._store, self.visible = store, visible
        self.cache_key = store.cache_key  # the same log

    async def read(self, stream, *, after=0, limit=None, tenant=None):
        events = [e for e in await self._store.read(stream, after=after, tenant=tenant) if e.seq <= self.visible]
        return events[:limit] if limit is not None else events

    async def load_snapshot(self, stream, name, version):
        return await self._store.load_snapshot(stream, name, version)

    async def save_snapshot(self, snapshot):
        return await self._store.save_snapshot(snapshot)


@pytest.mark.parametrize("kind", list(PROJECTIONS))
@SETTINGS
@given(spec=log_st.filter(lambda s: len(s) >= 2), data=st.data())
def test_a_reader_with_an_older_view_never_gets_a_state_from_the_future(kind, spec, data):
    make = PROJECTIONS[kind]

    async def body():
        store = InMemoryEventStore()
        events = await write(store, spec)
        cache = FoldCache()
        p = make(every=data.draw(st.integers(1, 8), label="every")) if kind in WITH_SNAPSHOTS else make()
        await p.load_info(store, STREAM, cache=cache)  # the holder (and snapshots) at the head
        v = data.draw(st.integers(0, len(events) - 1), label="older view")

        info = await p.load_info(OlderView(store, v), STREAM, cache=cache)

        assert info.seq == v and info.source != "cache"
        assert canon(p, info.state) == canon(p, reference(make(), events[:v]))
        assert cache.rejected == 1
        # The older reader did not move the holder backwards: a current reader hits it.
        now = await p.load_info(store, STREAM, cache=cache)
        assert (now.source, now.seq, now.folded) == ("cache", len(events), 0)
        assert canon(p, now.state) == canon(p, reference(make(), events))

    asyncio.run(body())


@pytest.mark.parametrize("kind", list(PROJECTIONS))
@SETTINGS
@given(old=log_st.filter(bool), new=log_st.filter(bool), data=st.data())
def test_a_holder_entry_from_another_log_is_rejected(kind, old, new, data):
    """Erase the stream and write another log under the same name (fresh ids): the
    holder's entry is not a prefix of it, whatever the lengths."""
    make = PROJECTIONS[kind]

    async def body():
        store = InMemoryEventStore()
        await write(store, old)
        cache = FoldCache()
        p = make()
        await p.load_info(store, STREAM, cache=cache)
        await store.erase(STREAM)

        events: list[Event] = []
        rest = list(new)
        while rest:  # grow the new log past the old one's length, reading as it grows
            n = data.draw(st.integers(1, len(rest)), label="chunk")
            events += await write(store, rest[:n])
            rest = rest[n:]
            info = await p.load_info(store, STREAM, cache=cache)
            assert canon(p, info.state) == canon(p, reference(make(), events))
        assert cache.rejected >= 1

    asyncio.run(body())


def test_a_holder_entry_from_another_log_of_the_same_length_is_rejected():
    async def body():
        store = InMemoryEventStore()
        spec = [("test.llm.requested", {"n": 1}), ("test.llm.completed", {"n": 2})]
        await write(store, spec)
        cache = FoldCache()
        p = stats_projection()
        await p.load_info(store, STREAM, cache=cache)
        await store.erase(STREAM)
        events = await write(store, [("test.tool.requested", {"n": 5}), ("test.tool.completed", {"n": 7})])

        info = await p.load_info(store, STREAM, cache=cache)

        assert (info.source, cache.rejected) == ("replay", 1)
        assert info.state == reference(stats_projection(), events)

    asyncio.run(body())


@pytest.mark.parametrize("kind", list(PROJECTIONS))
def test_the_self_check_replaces_a_wrong_holder_entry(kind, caplog):
    """A fold bug outlives the read that hit it until the self-check: every Nth read
    compares the holder with a whole-log fold, logs the difference and resets."""
    make = PROJECTIONS[kind]
    N = 5

    async def body():
        store = InMemoryEventStore()
        events = await write(store, [(t, {"n": i, "call": "c1"}) for i, t in enumerate(TYPES * 3)])
        cache = FoldCache(check_every=N, background=False)
        p = make()
        await p.load_info(store, STREAM, cache=cache)  # a miss: not counted
        key = (store.cache_key, STREAM, p.key, p.version)
        wrong = p.fold([events[0]])  # the state after one event, claiming the whole log
        cache.publish(key, Folded(len(events), events[-1].id, wrong, 0))

        served = []
        for i in range(1, N + 1):
            if i % 2 == 0:  # some reads see new events, folded onto the wrong state
                events += await write(store, [("test.llm.requested", {"n": 100 + i})])
            with caplog.at_level(logging.WARNING, logger="aaa_django.events"):
                served.append(await p.load_info(store, STREAM, cache=cache))

        truth = reference(make(), events)
        for info in served[:-1]:
            assert info.source == "cache"
            assert canon(p, info.state) != canon(p, reference(make(), events[: info.seq]))
        assert canon(p, served[-1].state) == canon(p, truth)
        assert (cache.checks, cache.resets) == (1, 1)
        assert any("differs from the whole-log fold" in r.getMessage() for r in caplog.records)
        # The entry was dropped: the next read folds from a snapshot or the log, correctly.
        after = await p.load_info(store, STREAM, cache=cache)
        assert after.source != "cache" and canon(p, after.state) == canon(p, truth)

    asyncio.run(body())


def test_the_self_check_keeps_a_correct_holder_entry(caplog):
    async def body():
        store = InMemoryEventStore()
        cache = FoldCache(check_every=3, background=False)
        p = stats_projection()
        for i in range(9):
            await write(store, [("test.llm.requested", {"n": i})])
            with caplog.at_level(logging.WARNING, logger="aaa_django.events"):
                await p.load_info(store, STREAM, cache=cache)

        assert (cache.checks, cache.resets, cache.hits) == (2, 0, 8)
        assert not caplog.records

    asyncio.run(body())


def test_the_self_check_runs_beside_the_read_when_asked_to_run_at_once(caplog):
    """With ``idle_after=0`` the Nth read is served from the holder at once; the
    whole-log comparison runs in a task beside it and resets a wrong entry when it
    finishes."""

    async def body():
        store = InMemoryEventStore()
        events = await write(store, [(t, {"n": i, "call": "c1"}) for i, t in enumerate(TYPES * 2)])
        cache = FoldCache(check_every=2, idle_after=0)
        p = stats_projection()
        await p.load_info(store, STREAM, cache=cache)
        key = (store.cache_key, STREAM, p.key, p.version)
        wrong = p.fold([events[0]])
        cache.publish(key, Folded(len(events), events[-1].id, wrong, 0, events[-1].time))
        with caplog.at_level(logging.WARNING, logger="aaa_django.events"):
            first = await p.load_info(store, STREAM, cache=cache)
            second = await p.load_info(store, STREAM, cache=cache)  # the check is due
            assert second.source == "cache" and cache.resets == 0  # not waited for
            await cache.wait_checks()
        assert (cache.checks, cache.resets) == (1, 1)
        assert first.source == "cache"
        assert any("differs from the whole-log fold" in r.getMessage() for r in caplog.records)
        after = await p.load_info(store, STREAM, cache=cache)
        assert after.source != "cache"
        assert canon(p, after.state) == canon(p, reference(stats_projection(), events))

    asyncio.run(body())


def test_an_erased_stream_rewritten_with_the_same_ids_is_not_served_from_the_holder():
    """The prefix proof is the event at the cursor: same id *and* same time. A stream
    erased and rewritten with the same ids (other data, later times) is another log."""
    from aaa_django.events import Event

    def total(state, e):
        state["total"] = state.get("total", 0) + e.data["n"]
        return state

    p = Projection(dict, total, name="test.total", version=1)

    async def body():
        store, cache = InMemoryEventStore(), FoldCache(check_every=0)
        root = Event.new(STREAM, "test.e", {"n": 1}, id="root")
        await store.append([root, root.derive("test.e", {"n": 2})])
        assert (await p.load(store, STREAM, cache=cache)) == {"total": 3}
        await store.erase(STREAM)
        root2 = Event.new(STREAM, "test.e", {"n": 100}, id="root")
        await store.append([root2, root2.derive("test.e", {"n": 200})])
        info = await p.load_info(store, STREAM, cache=cache)
        assert (info.source, info.state) == ("replay", {"total": 300})
        assert cache.rejected == 1

    asyncio.run(body())
