"""Live tokens across a Celery worker: a real worker process (``AAA["STREAM_TOKENS"]``
on in its settings) calls the model, the OpenAI-compatible client on a local server
speaking OpenAI's chunk stream, and publishes the reply's text as it comes; the web
process (this one, on the same settings) reads each run's tokens from the site's
token feed. Two runs at once: each feed gets its own run's text, in order, and nothing
of the other's. Each reply's end is held by the server until this process has read
all of its text, so every token was read while the log had no ``aaa.llm.completed``."""

from __future__ import annotations

import asyncio
import threading

from aaa_django.llm.deltas import TokenDelta
from aaa_django.runtime.event_types import LLM_COMPLETED, LLM_REQUESTED, RUN_COMPLETED
from aaa_django.site import tokens
from tests.llm.server import RecordedServer, Reply
from tests.llm.streams import openai_stream

from .conftest import CELERY_DB, make_engine
from .site import loop

pytestmark = [CELERY_DB]

#: the two replies, by name; which run gets which is the order their calls arrive in
TEXTS = {"lyon": ["Lyon", " is", " sunny."], "nice": ["Nice", " is", " windy", " tonight."]}


def test_a_workers_streamed_reply_reaches_the_web_process_before_its_event(new_cluster, arun, settings, celery_env):
    read_all = {name: threading.Event() for name in TEXTS}
    with RecordedServer() as server:
        # the finish of each reply (part 0 is the role, then one part per text) waits
        # until this process has read all of the reply's text
        server.script(
            *(
                Reply(parts=openai_stream(texts), holds={len(texts) + 1: read_all[name]})
                for name, texts in TEXTS.items()
            )
        )
        workers = new_cluster(1, suffix="-tokens", env={"AAA_TEST_MODEL_URL": server.url})
        settings.AAA = {
            **settings.AAA,
            "BUS": "celery",
            "STREAM_TOKENS": True,
            "REDIS_URL": celery_env["AAA_TEST_CELERY_BROKER"],
        }
        run_ids = ["run-tokens-1", "run-tokens-2"]
        # the web process subscribes before the runs start, as an event stream does
        # before its first read of the log
        feeds = {run_id: tokens.subscribe(run_id) for run_id in run_ids}
        assert all(feeds.values())

        async def main():
            async with make_engine(workers.queues) as engine:
                runs = [await engine.start(loop(), {"task": "Weather?"}, run_id=r) for r in run_ids]
                got: dict[str, list[TokenDelta]] = {r: [] for r in run_ids}
                log_then: dict[str, list[str]] = {}  # each run's log when its text was all read
                while len(log_then) < len(runs):
                    for run in runs:
                        got[run.run_id] += await asyncio.to_thread(feeds[run.run_id].wait, 0.05)
                        texts = [d.text for d in got[run.run_id]]
                        name = next((n for n, t in TEXTS.items() if t == texts), None)
                        types = [e.type for e in await run.events()]
                        if run.run_id not in log_then and (name or RUN_COMPLETED in types):
                            log_then[run.run_id] = types
                            if name:
                                read_all[name].set()
                outcomes = [await run.result(timeout=60) for run in runs]
                return got, log_then, outcomes, {run.run_id: await run.events() for run in runs}

        try:
            got, log_then, outcomes, logs = arun(main())
        finally:
            for feed in feeds.values():
                feed.close()
    assert workers.errors() == [], workers.logs()

    assert [o.outcome for o in outcomes] == ["success", "success"]
    assert [r.json["stream"] for r in server.requests] == [True, True]  # the worker streamed
    replies = set()
    for run_id in run_ids:
        [request] = [e for e in logs[run_id] if e.type == LLM_REQUESTED]
        [reply] = [e for e in logs[run_id] if e.type == LLM_COMPLETED]
        name = next(n for n, t in TEXTS.items() if "".join(t) == reply.data["response"]["message"]["content"])
        replies.add(name)
        # the run's text, in order, from its one model call, nothing of the other run
        assert got[run_id] == [TokenDelta(run_id, request.id, i, t) for i, t in enumerate(TEXTS[name])]
        # all of it read while the log had the request and not yet the reply
        assert LLM_REQUESTED in log_then[run_id] and LLM_COMPLETED not in log_then[run_id]
    assert replies == set(TEXTS)  # each run had its own reply
