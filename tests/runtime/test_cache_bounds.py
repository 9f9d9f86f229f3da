"""What a long-lived process keeps per run is bounded, and says its bound:
filled past its bound, each cache holds that many, the oldest (least recently used)
dropped first; and what a run's end drops is gone. A Celery worker serves any number
of runs (tests/celery/test_worker_memory.py: 5,000 of them, its memory flat)."""

from __future__ import annotations

from aaa_django.data import InMemoryBlobStore
from aaa_django.events import Event, FoldCache, InMemoryEventStore
from aaa_django.events.cache import MAX_ENTRIES, Folded
from aaa_django.events.store import RecentIds
from aaa_django.events.tail import MAX_STREAMS, TailCachedStore
from aaa_django.llm import fake
from aaa_django.llm.messages import LLMRequest, Message
from aaa_django.runtime import Engine, bounded
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED, completion_id, started_id
from aaa_django.store import DjangoEventStore, appends
from aaa_django.testing.eventstore import ev, run

STREAMS = [f"run-{i}" for i in range(5)]


def test_the_tail_keeps_the_logs_of_max_streams_streams():
    assert TailCachedStore(InMemoryEventStore()).max_streams == MAX_STREAMS
    store = TailCachedStore(InMemoryEventStore(), max_streams=3)
    for stream in STREAMS:
        run(store.append([ev(stream)]))
    run(store.read("run-2"))  # used: kept before run-3

    assert [s for s in STREAMS if store.cached(s, 1) is not None] == ["run-2", "run-3", "run-4"]
    store.forget("run-4")  # its run ended
    assert store.cached("run-4", 1) is None


def key(stream: str) -> tuple:
    return ("memory:1", stream, "test.tally", 1)


def test_the_fold_holder_keeps_max_entries_states():
    assert FoldCache().max_entries == MAX_ENTRIES
    cache = FoldCache(max_entries=3)
    for stream in STREAMS:
        cache.publish(key(stream), Folded(1, "e1", {}))

    assert len(cache) == 3 and cache.get(key("run-1")) is None and cache.get(key("run-2")) is not None


def test_a_store_remembers_the_newest_ids_it_appended():
    recent = RecentIds(size=3)
    events = [ev() for _ in range(5)]
    recent.add(events)

    assert [recent.pop(e.id) for e in events] == [False, False, True, True, True]
    assert RecentIds().size == 1024


def test_a_store_remembers_the_heads_of_hints_kept_streams(monkeypatch):
    monkeypatch.setattr(appends, "HINTS_KEPT", 3)
    store = DjangoEventStore("default")  # (no query: hints are memory)
    for i, stream in enumerate(STREAMS):
        store._remember(stream, i + 1, None)

    assert [s for s in STREAMS if store._forget(s) is not None] == ["run-2", "run-3", "run-4"]


def test_a_store_keeps_the_hints_of_as_many_streams_as_an_engine_keeps_the_logs_of():
    """Every run an engine carries appends from its hint, without asking the database:
    with hints for 1,024 streams, 3,000 runs in flight made four of a run's seven
    appends ask (benchmarks/bench_concurrency.py)."""
    from aaa_django.events.tail import MAX_STREAMS

    assert appends.HINTS_KEPT >= MAX_STREAMS
    assert appends.HINTS_KEPT >= bounded.RUNS_KEPT


def test_an_engine_keeps_the_started_events_and_algorithms_of_its_newest_runs(monkeypatch):
    monkeypatch.setattr(bounded, "STARTED_KEPT", 3)
    monkeypatch.setattr(bounded, "ALGORITHMS_KEPT", 2)
    inner = InMemoryEventStore()
    engine = Engine(inner)

    async def main() -> None:
        for stream in STREAMS:
            await inner.append(
                [
                    Event(
                        id=started_id(stream),
                        stream=stream,
                        type=RUN_STARTED,
                        data={"algorithm": "aaa.algos.ToolLoop", "config": {}},
                    )
                ]
            )
            engine.algorithm(await engine.started(stream))
        engine.forget("run-4")  # its run ended

    run(main())
    assert list(engine._started) == ["run-2", "run-3"]
    assert list(engine._algorithms) == [started_id("run-3")]


def test_an_engine_remembers_the_newest_runs_whose_end_it_delivered(monkeypatch):
    monkeypatch.setattr(bounded, "ENDED_KEPT", 2)
    engine = Engine(InMemoryEventStore())

    async def main() -> None:
        for stream in STREAMS[:3]:
            await engine.dispatch(
                Event(id=completion_id(stream), stream=stream, type=RUN_COMPLETED, data={"outcome": "success"})
            )

    run(main())
    assert list(engine._ended) == ["run-1", "run-2"]


def test_an_engine_keeps_the_newest_claim_checked_events_hydrated(monkeypatch):
    monkeypatch.setattr(bounded, "HYDRATED_KEPT", 2)
    engine = Engine(InMemoryEventStore(), blobs=InMemoryBlobStore(), claim_threshold=0)

    async def main() -> list[str]:
        stored = await engine.append([ev(stream, data={"payload": "x" * 64}) for stream in STREAMS])
        for e in stored:
            assert (await engine.hydrate(e)).data == {"payload": "x" * 64}
        return [e.id for e in stored]

    ids = run(main())
    assert list(engine._hydrated) == ids[-2:]


def test_the_scripted_model_remembers_the_conversations_of_its_newest_runs(monkeypatch):
    monkeypatch.setattr(fake, "COUNTED_RUNS", 2)
    client = fake.FakeLLMClient(lambda request: "done")
    for stream in ["run-0", "run-1", "run-0", "run-2"]:
        client.input_chars(LLMRequest(messages=[Message(role="user", content="hi")], run_id=stream))

    assert list(client._counted) == ["run-0", "run-2"]


def test_a_delivery_after_its_runs_end_keeps_nothing_of_the_run():
    """An event of an ended run delivered again (a re-drive, a redelivered message, or
    a delivery that overlapped the end and read its run after it) reads the run back:
    once that delivery is over, what it read is dropped again."""
    from aaa_django.algos import ToolLoop
    from tests.runtime.helpers import arun, make_engine

    async def main():
        async with make_engine(lambda request: "done") as engine:
            run_ = await engine.start(ToolLoop(), {"task": "t"})
            assert (await run_.result(timeout=10)).outcome == "success"
            started = (await engine.store.read(run_.run_id, limit=1))[0]
            await engine.handle(started)  # delivered again
            return engine, run_.run_id

    engine, run_id = arun(main())
    assert engine.tail.cached(run_id, 1) is None
    assert len(engine.cache) == 0 and run_id not in engine._started
