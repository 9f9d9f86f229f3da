"""The fast publisher of a worker's deliveries (aaa_django.celery.publish), against a real Redis
broker: the message it leaves in the queue is the one ``send_task`` leaves (but for
the ids every message gets), and it steps aside wherever the two could differ."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from celery import Celery, signals

import aaa_django.tasks  # noqa: F401  (defines aaa.deliver, as a worker's autodiscovery does)
from aaa_django.celery.bus import DELIVER, DistributedBus
from aaa_django.celery.publish import FastPublisher

ARGS = [
    ["django", "postgres", "aaa_django.store.DjangoEventStore"],
    "run-1",
    3,
    "ev-3",
    json.dumps(["ev-2", {"id": "ev-3", "data": {"text": "héllo"}}]),
]
REPR = repr(ARGS[1:4])
#: what differs between any two messages: their ids
IDS = {("headers", "id"), ("headers", "root_id"), ("properties", "correlation_id"), ("properties", "delivery_tag")}


@pytest.fixture
def app(redis_url):
    app = Celery(f"publish-{uuid.uuid4().hex[:6]}", broker=redis_url, set_as_current=False)
    app.conf.task_ignore_result = True
    yield app
    app.close()


@pytest.fixture
def queue(app):
    name = f"aaa.test-publish-{uuid.uuid4().hex[:8]}"
    yield name
    with app.connection_for_write() as conn:
        conn.default_channel.client.delete(name)


def taken(app, queue) -> list[dict]:
    """The messages in ``queue``, oldest first (kombu's Redis queue is a list)."""
    with app.connection_for_write() as conn:
        raw = conn.default_channel.client.lrange(queue, 0, -1)
    return [json.loads(m) for m in reversed(raw)]


def without_ids(message: dict) -> dict:
    message = json.loads(json.dumps(message))
    for part, key in IDS:
        message[part].pop(key)
    return message


def test_the_message_is_the_one_send_task_sends(app, queue):
    fast = FastPublisher(app)
    app.send_task(DELIVER, ARGS, queue=queue, argsrepr=REPR, kwargsrepr="{}", ignore_result=True)
    assert fast.send(DELIVER, ARGS, queue, REPR) and fast.send(DELIVER, ARGS, queue, REPR)
    celery, ours, again = taken(app, queue)

    assert without_ids(ours) == without_ids(celery) == without_ids(again)
    assert ours["headers"]["id"] == ours["properties"]["correlation_id"] != again["headers"]["id"]
    body = json.loads(base64.b64decode(ours["body"]))
    assert body[0] == ARGS and body[1] == {}
    assert ours["headers"]["argsrepr"] == REPR and ours["headers"]["task"] == DELIVER
    assert (fast.sent, fast.declined) == (2, 0)
    fast.close()


def test_a_publish_receiver_sees_every_message(app, queue):
    # Tracing integrations hook the publish signals: then send_task sends (and they see it).
    fast = FastPublisher(app)
    seen = []

    def receiver(sender=None, **kwargs):
        seen.append(sender)

    signals.before_task_publish.connect(receiver)
    try:
        assert not fast.send(DELIVER, ARGS, queue, REPR)
    finally:
        signals.before_task_publish.disconnect(receiver)
    assert fast.send(DELIVER, ARGS, queue, REPR)
    assert (fast.sent, fast.declined) == (1, 1)


@pytest.mark.parametrize(
    "conf",
    [
        {"task_routes": {DELIVER: {"priority": 5}}},  # a route that sets more than the queue
        {"task_compression": "gzip"},
        {"task_protocol": 1},
        {"task_default_priority": 3},
        {"task_send_sent_event": True},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_configuration_it_cannot_reproduce_is_left_to_send_task(app, queue, conf):
    app.conf.update(conf)
    fast = FastPublisher(app)
    assert not fast.send(DELIVER, ARGS, queue, REPR)
    assert taken(app, queue) == []  # nothing sent: the caller sends with send_task


def test_a_queue_with_priorities_or_another_exchange_is_left_to_send_task(app):
    from kombu import Exchange, Queue

    app.conf.task_queues = [
        Queue("aaa.test-prio", Exchange("aaa.test-prio"), routing_key="aaa.test-prio", max_priority=9),
        Queue("aaa.test-topic", Exchange("aaa.test", type="topic"), routing_key="aaa.#"),
    ]
    fast = FastPublisher(app)
    assert not fast.send(DELIVER, ARGS, "aaa.test-prio", REPR)
    assert not fast.send(DELIVER, ARGS, "aaa.test-topic", REPR)


def test_the_registered_task_with_its_default_options_is_sent_fast(app, queue):
    app.finalize()  # aaa.deliver registered: its options (the app's serializer) change nothing
    assert FastPublisher(app).send(DELIVER, ARGS, queue, REPR)
    app.send_task(DELIVER, ARGS, queue=queue, argsrepr=REPR, kwargsrepr="{}", ignore_result=True)
    ours, celery = taken(app, queue)
    assert without_ids(ours) == without_ids(celery)


def test_another_broker_is_left_to_send_task():
    app = Celery("publish-memory", broker="memory://", set_as_current=False)
    assert not FastPublisher(app).send(DELIVER, ARGS, "aaa.algorithms", REPR)


def test_a_failed_publish_falls_back_to_send_task(app, queue, monkeypatch):
    monkeypatch.setattr("aaa_django.celery.bus.celery_app", lambda: app)
    with override_fast(True):
        bus = DistributedBus(in_worker=True)
        bus.spec = ARGS[0]
        bus._send([(queue, ARGS)], [], swallow=False)  # makes the fast publisher
        fast = bus.publisher()
        assert fast.sent == 1

        class Broken:
            def publish(self, *args, **kwargs):
                raise ConnectionError("the broker went away")

        fast._producer = Broken()
        bus._send([(queue, ARGS)], [], swallow=False)
    assert fast.declined == 1 and fast._producer is None  # dropped: a new one next time
    assert bus.sent == 2
    assert len(taken(app, queue)) == 2  # the second one by send_task


def test_the_setting_turns_it_off(app, queue, monkeypatch):
    monkeypatch.setattr("aaa_django.celery.bus.celery_app", lambda: app)
    with override_fast(False):
        bus = DistributedBus(in_worker=True)
        bus.spec = ARGS[0]
        bus._send([(queue, ARGS)], [], swallow=False)
        assert bus.publisher() is None
    assert len(bus._publishers) == 0 and bus.sent == 1 and len(taken(app, queue)) == 1


def override_fast(on: bool):
    from django.test import override_settings

    from aaa_django.conf import site_aaa

    return override_settings(AAA={**site_aaa(), "CELERY_FAST_PUBLISH": on})


def test_each_sending_thread_has_its_own_publisher(app, queue, monkeypatch):
    # A web process commits appends in more than one thread: kombu connections are
    # not shared between threads, so each thread that sends gets its own publisher.
    import threading

    monkeypatch.setattr("aaa_django.celery.bus.celery_app", lambda: app)
    with override_fast(True):
        bus = DistributedBus()  # the web process's
        bus.spec = ARGS[0]
        seen = []

        def send():
            bus._send([(queue, ARGS)], [], swallow=False)
            seen.append(bus.publisher())

        threads = [threading.Thread(target=send) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        send()
    assert len({id(p) for p in seen}) == 3 and [p.sent for p in seen] == [1, 1, 1]
    assert bus.sent == 3 and len(taken(app, queue)) == 3
    assert sorted(map(id, bus._publishers)) == sorted(map(id, seen))


def test_a_thread_that_ends_drops_its_publisher(app, queue, monkeypatch):
    # A server that starts a thread per request must not collect a connection per
    # thread: the publisher (and its connection) goes with its thread.
    import gc
    import threading

    monkeypatch.setattr("aaa_django.celery.bus.celery_app", lambda: app)
    with override_fast(True):
        bus = DistributedBus()
        bus.spec = ARGS[0]
        for _ in range(3):
            t = threading.Thread(target=lambda: bus._send([(queue, ARGS)], [], swallow=False))
            t.start()
            t.join()
        gc.collect()
        assert len(bus._publishers) == 0 and bus.sent == 3 and len(taken(app, queue)) == 3


def test_sent_from_inside_a_task_it_names_that_task_as_send_task_does(app, queue):
    # A worker sends from the task's own thread: send_task names the delivering task
    # as the new message's parent (and its root), for tracing; so does the publisher.
    from celery._state import _task_stack

    @app.task(name="aaa.test.parent", shared=False)
    def parent_task():
        pass

    parent_task.push_request(id="parent-1", root_id="root-1", called_directly=False)
    _task_stack.push(parent_task)
    try:
        fast = FastPublisher(app)
        app.send_task(DELIVER, ARGS, queue=queue, argsrepr=REPR, kwargsrepr="{}", ignore_result=True)
        assert fast.send(DELIVER, ARGS, queue, REPR)
    finally:
        _task_stack.pop()
        parent_task.pop_request()
    celery, ours = taken(app, queue)
    assert (ours["headers"]["parent_id"], ours["headers"]["root_id"]) == ("parent-1", "root-1")
    assert without_ids(ours) == without_ids(celery)  # the rest alike too


def test_an_option_of_the_task_itself_is_left_to_send_task(app, queue):
    # send_task merges the options a registered task sets (a priority, a time limit).
    app.finalize()  # (aaa.deliver registered, as in a worker)
    app.tasks[DELIVER].priority = 5
    assert not FastPublisher(app).send(DELIVER, ARGS, queue, REPR)
    app.send_task(DELIVER, ARGS, queue=queue, argsrepr=REPR, kwargsrepr="{}", ignore_result=True)
    # send_task's message has the priority, and lands in the queue's priority list
    assert taken(app, queue) == []
    with app.connection_for_write() as conn:
        client = conn.default_channel.client
        (key,) = [k for k in client.keys(queue + "*") if k != queue.encode()]
        (sent,) = [json.loads(m) for m in client.lrange(key, 0, -1)]
        client.delete(key)
    assert sent["properties"]["priority"] == 5


@pytest.mark.django_db(databases=["default", "postgres"], transaction=True)
def test_committed_events_of_several_runs_are_sent_at_once_not_one_thread_at_a_time(app, pg_alias):
    """The web process's engine appends through the site's store, which commits each
    append it awaits: its events are sent at once, from several threads, not queued
    on Django's one thread-sensitive thread for on_commit (200 runs started at once
    would take 0.4-0.6 s there). Two sends that can only
    finish together (a barrier of two) both finish."""
    import asyncio
    import threading

    from asgiref.sync import async_to_sync

    from aaa_django.events import Event, EventList
    from aaa_django.site.engines import build_engine

    bus = DistributedBus(app=app)
    together = threading.Barrier(2, timeout=10)
    threads: list[str] = []

    def send(messages, ended, **kw):
        threads.append(threading.current_thread().name)
        together.wait()

    bus._send = send
    engine = build_engine(using=pg_alias, bus=bus)

    def batch(run: str) -> EventList:
        out = EventList([Event(id=f"{run}-1", stream=run, type="aaa.run.started", data={}, seq=1)])
        out.committed = True
        return out

    async def main():
        await asyncio.gather(bus.publish(batch("run-a")), bus.publish(batch("run-b")))

    async_to_sync(main)()
    assert len(threads) == 2 and len(set(threads)) == 2
    assert engine.bus is bus
