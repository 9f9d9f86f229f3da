"""The change stream of many runs (``GET /changes``) and the batch read (``POST /runs/batch``).

A stream begins with each run of its filter as it is now, in the order of their last
changes, and goes on with each change (a start, a status, an outcome, spend, an end) as it
comes; its ids increase; a client that resumes with ``Last-Event-ID`` gets what changed
after it, nothing twice, nothing missed. A user sees only the runs it may see. On a live
server (SQLite, the engine host running the runs): 50 runs watched over one stream under
the default rate limit, every run's changes seen once each, then read in one request.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from django.core.cache import cache

from aaa_django.api import streamcap
from aaa_django.events import Event
from aaa_django.models import RunRecord
from aaa_django.runtime.event_types import INPUT_VALIDATED, RUN_COMPLETED, completion_id
from aaa_django.store import DjangoEventStore, changes

from .sse import Live, Message, messages

pytestmark = pytest.mark.django_db


def position(message: Message) -> tuple[int, str]:
    return changes.parse(message.id or "")


def watch(api, user, query: str = "", **headers) -> list[Message]:
    """The messages of a change stream that ends once it has sent what has changed."""
    r = api.get(f"/changes?follow=false{query}", headers={**user.auth, **headers})
    assert r.status_code == 200, r.content
    assert r["Content-Type"].startswith("text/event-stream")
    return messages(r.content)


def end(run_id: str, outcome: str = "success") -> None:
    DjangoEventStore("default").append_sync(
        [
            Event(
                id=completion_id(run_id),
                stream=run_id,
                type=RUN_COMPLETED,
                data={"outcome": outcome, "value": {"n": 1}},
            )
        ]
    )


def test_a_stream_begins_with_each_run_as_listed_in_the_order_of_their_changes(api, alice, bob, make_run):
    first = make_run(alice)
    done = make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED], outcome="no_solution")
    third = make_run(alice)
    make_run(bob)

    got = watch(api, alice)

    assert [m.data["id"] for m in got] == [first, done, third]
    assert got[0].data["url"].endswith(f"/runs/{first}")
    assert [position(m) for m in got] == sorted(position(m) for m in got)
    assert len({m.id for m in got}) == 3
    listed = {i["id"]: i for i in api.get("/runs", headers=alice.auth).json()["items"]}
    assert [m.data for m in got] == [listed[m.data["id"]] for m in got]  # as GET /runs lists it
    assert got[1].data["status"] == "completed" and got[1].data["outcome"] == "no_solution"


def test_a_user_never_sees_another_users_runs(api, alice, bob, carol, make_run):
    hers = [make_run(alice), make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED])]
    his = make_run(bob)

    assert [m.data["id"] for m in watch(api, bob)] == [his]
    assert watch(api, bob, f"&ids={','.join(hers)}") == []  # named, still not his
    assert [m.data["id"] for m in watch(api, alice)] == hers
    assert {m.data["id"] for m in watch(api, carol)} == {*hers, his}  # carol sees every run
    assert api.get("/changes?follow=false").status_code == 401


def test_the_filters_narrow_the_runs_followed(api, alice, make_run):
    a = make_run(alice)
    b = make_run(alice, algorithm="tests.api.idle")
    c = make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED])
    RunRecord.objects.filter(pk=a).update(started_at=datetime(2020, 1, 1, tzinfo=timezone.utc))

    def ids(query):
        return [m.data["id"] for m in watch(api, alice, query)]

    assert ids("&algorithm=tests.api.idle") == [b]
    assert ids("&status=completed") == [c]
    assert ids("&status=running") == [a, b]
    assert ids(f"&ids={c},{a},run-unknown") == [a, c]
    assert ids("&started_after=2025-01-01T00:00:00Z") == [b, c]
    assert ids("&started_after=2025-01-01T00:00:00Z&status=running") == [b]


def test_resuming_after_an_id_sends_what_changed_after_it_once_each(api, alice, make_run):
    r1, r2, r3 = make_run(alice), make_run(alice), make_run(alice)
    before = watch(api, alice)
    assert [m.data["id"] for m in before] == [r1, r2, r3]
    cut = before[1].id  # the client saw r1 and r2, then lost the connection

    end(r1)  # r1 ends, r4 starts: both come after r3
    r4 = make_run(alice)

    resumed = watch(api, alice, **{"Last-Event-ID": cut})
    assert [(m.data["id"], m.data["status"]) for m in resumed] == [(r3, "running"), (r1, "completed"), (r4, "running")]
    assert all(position(m) > changes.parse(cut) for m in resumed)
    # the same from the query; Last-Event-ID (what EventSource sends) wins over it
    assert watch(api, alice, f"&after={cut}") == resumed
    assert watch(api, alice, f"&after={before[0].id}", **{"Last-Event-ID": cut}) == resumed
    # from the last id there is nothing new, until something changes
    assert watch(api, alice, **{"Last-Event-ID": resumed[-1].id}) == []
    end(r4, "cancelled")
    [last] = watch(api, alice, **{"Last-Event-ID": resumed[-1].id})
    assert (last.data["id"], last.data["outcome"]) == (r4, "cancelled")


def test_a_bad_position_or_filter_is_422_naming_it(api, alice):
    cases = [
        ("/changes?after=nope", {}, ["query", "after"]),
        ("/changes", {"Last-Event-ID": "12"}, ["header", "Last-Event-ID"]),
        ("/changes", {"Last-Event-ID": "1" * 19 + ".run-a"}, ["header", "Last-Event-ID"]),
        ("/changes?ids=" + ",".join(f"run-{i}" for i in range(101)), {}, ["query", "ids"]),
        ("/changes?ids=a,,b", {}, ["query", "ids"]),
        ("/changes?status=sleeping", {}, ["query", "status"]),
        ("/changes?started_after=yesterday", {}, ["query", "started_after"]),
    ]
    for path, headers, loc in cases:
        r = api.get(path, headers={**alice.auth, **headers})
        assert r.status_code == 422, (path, r.content)
        assert loc in [e["loc"][:2] for e in r.json()["detail"]], (path, r.json())


def test_a_change_stream_counts_among_the_users_open_streams(api, alice, settings):
    settings.AAA = {**settings.AAA, "API_STREAMS_PER_USER": 1}
    held = streamcap.acquire(alice.pk, 1)  # an event stream of hers, open
    assert held is not None
    r = api.get("/changes?follow=false", headers=alice.auth)
    assert r.status_code == 429 and r.json()["detail"][0]["type"] == "too_many_streams"
    assert r["Retry-After"]
    held.release()
    assert api.get("/changes?follow=false", headers=alice.auth).status_code == 200
    assert cache.get(f"aaa:streams:{alice.pk}:0") is None  # given back when it ended


def test_a_batch_read_gives_each_run_as_get_run_shows_it_and_only_the_callers(api, alice, bob, make_run):
    done = make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED], value={"answer": 42})
    running = make_run(alice)
    his = make_run(bob)

    r = api.post("/runs/batch", json={"ids": [running, his, done, "run-unknown", running]}, headers=alice.auth)

    assert r.status_code == 200, r.json()
    body = r.json()
    assert [i["id"] for i in body["items"]] == [running, done]  # in the order asked, once each
    assert body["missing"] == [his, "run-unknown"]  # not hers and unknown: alike
    for item in body["items"]:
        assert item == api.get(f"/runs/{item['id']}", headers=alice.auth).json()
    assert body["items"][1]["value"] == {"answer": 42}


def test_a_batch_read_refuses_what_is_not_a_list_of_ids(api, alice):
    for body, loc in [
        ({"ids": []}, "ids"),
        ({"ids": ["ok"] * 101}, "ids"),
        ({"ids": ["../x"]}, "ids"),
        ({"ids": "run-a"}, "ids"),
        ({"runs": ["run-a"]}, "runs"),
    ]:
        r = api.post("/runs/batch", json=body, headers=alice.auth)
        assert r.status_code == 422, (body, r.json())
        assert any(loc in e["loc"] for e in r.json()["detail"]), (body, r.json())
    assert api.get("/runs/batch", headers=alice.auth).status_code == 405


# -- on a live server ----------------------------------------------------------------------


def let_go(client, user, slots: int = 10) -> None:
    """Until the server has ended the user's closed streams (it learns that a client has
    gone when it next writes: a run is started until it has), so no stream outlives the test."""
    import time

    for _ in range(60):
        if all(cache.get(f"aaa:streams:{user.pk}:{i}") is None for i in range(slots)):
            return
        client.json("POST", "/runs", {"algorithm": "tests.api.echo", "input": {"text": "nudge"}})
        time.sleep(0.5)
    raise AssertionError("a stream of the user is still open")


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_50_runs_watched_over_one_stream_every_change_once_and_no_429(live_server, alice, host, settings):
    from .test_stream_live import Http

    # the defaults a site has: 600 requests a minute, 10 open streams per user
    settings.AAA = {**settings.AAA, "API_RATE": "600/min", "API_STREAMS_PER_USER": 10}
    cache.clear()
    client = Http(live_server.url, alice.auth)
    stream = Live(live_server.url, "/api/aaa/changes", alice.auth)
    assert stream.status == 200
    texts = {f"text {i}" for i in range(50)}
    statuses, runs = [], {}
    for text in sorted(texts):
        status, run = client.json("POST", "/runs", {"algorithm": "tests.api.echo", "input": {"text": text}})
        statuses.append(status)
        runs[run["id"]] = text

    got: list[Message] = []
    ended: set[str] = set()
    while ended != set(runs):
        m = stream.next()
        assert m is not None, "the stream closed"
        got.append(m)
        if m.data["status"] == "completed":
            ended.add(m.data["id"])
    stream.close()

    assert statuses == [201] * 50
    assert {m.data["id"] for m in got} == set(runs)
    assert [position(m) for m in got] == sorted(position(m) for m in got)  # in order
    assert len({m.id for m in got}) == len(got)  # no change twice
    for run_id in runs:
        mine = [m.data for m in got if m.data["id"] == run_id]
        assert [d["last_seq"] for d in mine] == sorted({d["last_seq"] for d in mine})
        assert [d["status"] for d in mine].count("completed") == 1 and mine[-1]["status"] == "completed"
    # what the stream said last of each run is the run as it ended
    status, batch = client.json("POST", "/runs/batch", {"ids": list(runs)})
    let_go(client, alice)
    assert status == 200 and batch["missing"] == []
    last = {m.data["id"]: m.data for m in got}
    for item in batch["items"]:
        assert item["value"] == {"echo": runs[item["id"]]}
        assert {k: item[k] for k in last[item["id"]]} == last[item["id"]]
