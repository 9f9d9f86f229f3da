"""Live tokens through the event stream (SSE) on a real HTTP server: a run's model
call streams from a local server speaking OpenAI's chunk format, and a client reading
``/runs/{id}/events/stream`` gets ``event: token`` messages as the text is written --
the server holds the rest of the reply until the client has read the first token --
then the reply's ``aaa.llm.completed``, whose text is the tokens' text. The log holds
no token; a stream read after the run holds none either."""

from __future__ import annotations

import json
import threading

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.runtime.event_types import LLM_COMPLETED, RUN_COMPLETED, RUN_STARTED
from aaa_django.tools import ToolRegistry
from tests.llm.live import model_server, tokens_host  # noqa: F401  (fixtures)
from tests.llm.server import Reply
from tests.llm.streams import openai_stream

from .test_stream_live import Http

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TEXTS = ["Lyon", " is", " sunny", " today."]


def messages(stream):
    """(event name, id, data) of each SSE message until the server closes."""
    fields: dict[str, str] = {}
    while line := stream.response.readline():
        line = line.decode("utf-8").rstrip("\n")
        if line == "":
            if "data" in fields:
                yield fields.get("event", "message"), fields.get("id"), json.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def test_tokens_reach_an_sse_client_before_the_replys_event(live_server, alice, model_server, tokens_host):  # noqa: F811
    listening, first_token_read = threading.Event(), threading.Event()
    # the reply starts once the client listens; its second text waits for the first's token
    model_server.script(Reply(parts=openai_stream(TEXTS), holds={0: listening, 2: first_token_read}))
    client = Http(live_server.url, alice.auth)
    status, run = client.json(
        "POST",
        "/runs",
        {
            "algorithm": "aaa.algos.ToolLoop",
            "config": ToolLoop(ToolRegistry([])).config(),
            "input": {"task": "Weather in Lyon?"},
        },
    )
    assert status == 201, run
    stream = client.stream(f"/runs/{run['id']}/events/stream")
    assert stream.status == 200
    got = []
    for name, _, data in messages(stream):
        got.append((name, data))
        if name == "message" and data["type"] == RUN_STARTED:
            listening.set()  # subscribed before it read the log
        if name == "token":
            first_token_read.set()
    stream.close()

    tokens = [d for name, d in got if name == "token"]
    [reply] = [i for i, (name, d) in enumerate(got) if name == "message" and d["type"] == LLM_COMPLETED]
    assert [d["text"] for d in tokens] == TEXTS and [d["index"] for d in tokens] == [0, 1, 2, 3]
    assert max(i for i, (name, _) in enumerate(got) if name == "token") < reply  # all before the reply
    assert {d["request_id"] for d in tokens} == {got[reply][1]["data"]["request_id"]}
    assert {d["run_id"] for d in tokens} == {run["id"]}
    assert got[reply][1]["data"]["response"]["message"]["content"] == "".join(TEXTS)
    assert got[-1][1]["type"] == RUN_COMPLETED and got[-1][1]["data"]["outcome"] == "success"

    # the log has the events alone; a stream of the ended run is its log, without tokens
    log = client.json("GET", f"/runs/{run['id']}/events?limit=1000")[1]["items"]
    assert [d for name, d in got if name == "message"] == log
    replay = client.stream(f"/runs/{run['id']}/events/stream")
    assert [name for name, _, _ in messages(replay)] == ["message"] * len(log)
    replay.close()
