"""What a run shows of itself on Celery workers: its signals are sent by the process
that appended each event (a worker for all but the start), after commit, once each."""

from __future__ import annotations

import json
import os

from aaa_django.runtime.event_types import (
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    RUN_STARTED,
    TOOL_REQUESTED,
)

from .conftest import CELERY_DB, make_engine
from .site import connect_signals, loop, script

pytestmark = [CELERY_DB]


def test_signals_are_sent_by_the_process_that_appended(cluster, arun, redis):
    connect_signals()  # this process records what it sends too
    try:

        async def main():
            async with make_engine() as engine:
                run = await engine.start(loop(), {"task": script(turns=2, tool="gated")})
                # the approval_requested receiver (in a worker) names the request
                _, request_id = await _blpop(redis, f"aaa-test:approval:{run.run_id}")
                assert await engine.approve(run.run_id, request_id, by="staff")
                outcome = await run.result(timeout=60)
                # the end's signal is sent just after its commit: wait for it, not the end
                await _blpop(redis, f"aaa-test:ended:{run.run_id}")
                return run.run_id, outcome, await run.events()

        run_id, outcome, events = arun(main())
    finally:
        connect_signals(False)

    assert outcome.outcome == "success"
    sent = [json.loads(x) for x in redis.lrange(f"aaa-test:signals:{run_id}", 0, -1)]
    appended = [s for s in sent if s["signal"] == "event_appended"]
    assert sorted(s["event"] for s in appended) == sorted(e.id for e in events), (  # each once
        [e.type for e in events if e.id not in {s["event"] for s in appended}]
    )
    by = {s["event"]: s["pid"] for s in appended}
    # this process appended the start and the approval; the workers all the rest
    ours = {e.id for e in events if e.type in (RUN_STARTED, APPROVAL_GRANTED)}
    assert {by[i] for i in ours} == {os.getpid()}
    workers = {pid for event, pid in by.items() if event not in ours}
    assert os.getpid() not in workers and workers <= {p for w in cluster.live() for p in w.children()}
    [ended] = [s for s in sent if s["signal"] == "run_ended"]
    assert ended["outcome"] == "success" and ended["pid"] in workers
    [asked] = [s for s in sent if s["signal"] == "approval_requested"]
    assert asked["event"] == next(e.id for e in events if e.type == APPROVAL_REQUESTED)
    assert [s["signal"] for s in sent if s["signal"] == "run_started"] == ["run_started"]


async def _blpop(redis, key: str, timeout: int = 60):
    import asyncio

    import redis as redis_py

    # a client of its own without redis-py's default 5 s socket timeout (redis 8), which
    # would cut a longer BLPOP short (a loaded machine takes longer than 5 s to get there)
    waiting = redis_py.Redis.from_url(os.environ["AAA_TEST_CELERY_BROKER"], decode_responses=True, socket_timeout=None)
    try:
        found = await asyncio.to_thread(waiting.blpop, [key], timeout)
    finally:
        waiting.close()
    assert found is not None, f"nothing on {key} within {timeout} s"
    return found


def test_worker_log_lines_carry_their_delivery(new_cluster, arun, tmp_path):
    log_file = tmp_path / "workers.jsonl"
    workers = new_cluster(1, suffix="-logs", env={"AAA_TEST_LOG_FILE": str(log_file)})

    async def main():
        async with make_engine(workers.queues) as engine:
            run = await engine.start(loop(), {"task": script(turns=2, tool="chatty")})
            outcome = await run.result(timeout=60)
            return run.run_id, outcome, await run.events()

    run_id, outcome, events = arun(main())
    workers.stop()  # its log is complete

    assert outcome.outcome == "success"
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    # the tool's own line, written during the delivery of its request
    [tool_line] = [x for x in lines if x["message"] == "chatty tool ran with n=0"]
    request = next(e for e in events if e.type == TOOL_REQUESTED)
    assert (tool_line["run_id"], tool_line["seq"], tool_line["event_type"]) == (run_id, request.seq, TOOL_REQUESTED)
    assert tool_line["logger"] == "tests.celery.site" and tool_line["level"] == "WARNING"
    # Celery's own line about each delivery task names the event it carried: the run's
    # start (the worker delivered the rest on its own loop, without a message)
    done = [x for x in lines if x["logger"] == "celery.app.trace" and "succeeded" in x["message"]]
    delivered = {x["seq"] for x in done if x.get("run_id") == run_id}
    assert 1 in delivered and delivered <= {e.seq for e in events}


def test_one_run_delivered_by_two_workers_is_one_trace(new_cluster, arun, tmp_path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from aaa_django.observe.otel import OtelObserver, RunTrace

    spans_file = tmp_path / "spans.jsonl"
    env = {"AAA_TEST_OTEL_FILE": str(spans_file)}
    # one worker takes the algorithms' queue, the other the model's and the tools'
    workers = new_cluster(1, suffix="-otel", env=env, queues="aaa.algorithms-otel")
    workers.start(1, queues="aaa.llm-otel,aaa.tools-otel")
    ours = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ours))

    async def main():
        async with make_engine(workers.queues) as engine:
            otel = engine.observe(OtelObserver(engine, tracer_provider=provider))
            engine.bus.carry(otel)  # as build_engine does with AAA["OTEL"]
            with provider.get_tracer("the-site").start_as_current_span("POST /runs"):
                run = await engine.start(loop(), {"task": script(turns=3)})
            outcome = await run.result(timeout=60)
            return run.run_id, outcome

    run_id, outcome = arun(main())
    workers.stop()  # the delivery that ended the run has finished: its spans are written

    assert outcome.outcome == "success"
    [request] = ours.get_finished_spans()
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    trace_id = f"0x{request.context.trace_id:032x}"
    assert {s["context"]["trace_id"] for s in spans} == {trace_id}  # one trace, the request's
    [run_span] = [s for s in spans if s["name"].startswith("aaa.run ")]
    assert run_span["parent_id"] == f"0x{request.context.span_id:016x}"
    assert run_span["context"]["span_id"] == f"0x{RunTrace.derived(run_id).span_id:016x}"
    others = [s for s in spans if s is not run_span]
    assert {s["parent_id"] for s in others} == {run_span["context"]["span_id"]}
    # by two workers: the steps in one, the model and tool calls in the other
    pids = {
        kind: {s["attributes"]["test.pid"] for s in spans if s["name"].startswith(kind)}
        for kind in ("aaa.step", "chat", "execute_tool")
    }
    assert len(pids["aaa.step"]) == 1 and pids["chat"] == pids["execute_tool"]
    assert pids["aaa.step"].isdisjoint(pids["chat"])
    assert len([s for s in spans if s["name"].startswith("chat")]) == 3
