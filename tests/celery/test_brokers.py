"""Long timers on both brokers: a run's deadline and an approval's expiry hold no message.

The due times live in the run index (``RunRecord.due_at``) and the workers' periodic
duty fires them (``aaa_django.celery.duty``); no worker holds a message until they come. A
held message is what each broker punishes: RabbitMQ closes the channel of a delivery
left unacknowledged past ``consumer_timeout`` (20 s under bin/test, looked at every
second) and the worker goes down with it; Redis hands it to another worker after the
visibility timeout. Each broker gets a cluster of two workers of its own, on queues
of its own.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from aaa_django.models import RunRecord
from aaa_django.runtime.event_types import APPROVAL_EXPIRED, APPROVAL_REQUESTED, RUN_COMPLETED

from .conftest import BROKERS, CELERY_DB, _broker, make_engine
from .site import Idle, loop, script
from .workers import Cluster

pytestmark = [CELERY_DB]

#: the test RabbitMQ's consumer_timeout (bin/test): a message held longer is one held
#: for a timer (a delivery takes seconds at most, even on a loaded machine); on Redis
#: the tests judge by it too
PATIENCE = 20.0
#: longer than PATIENCE and one look at it (1 s); tests/celery/site.py's
#: gated_for_a_while expires after as long
LONG = PATIENCE + 4
#: a day
DAY = 86_400.0


@pytest.fixture(scope="module", params=BROKERS)
def on(request, celery_env, tmp_path_factory):
    """(broker, its cluster of two workers)."""
    broker = _broker(request)
    env = {**celery_env, **broker.env, "AAA_TEST_QUEUE_SUFFIX": broker.suffix("timers")}
    cluster = Cluster(env, tmp_path_factory.mktemp(f"timers-{broker.name}"))
    try:
        cluster.start(2)
        yield broker, cluster
    finally:
        cluster.stop()


def held(broker, cluster) -> int:
    """The messages the cluster's workers hold until an ETA (Celery's ``scheduled``);
    every worker must answer. A worker busy with a step on a loaded machine can miss the
    5 s of one ask: the workers that did not answer are asked again, three times at most."""
    names = [f"{w.name}@{socket.gethostname()}" for w in cluster.workers]
    replies: dict = {}
    for _ in range(4):
        missing = [n for n in names if n not in replies]
        if not missing:
            break
        replies.update(broker.app.control.inspect(destination=missing, timeout=5).scheduled() or {})
    assert sorted(replies) == sorted(names), f"answers from {sorted(replies)} of {names}"
    return sum(len(v) for v in replies.values())


def ticks(broker, cluster) -> int:
    """``aaa.tick`` tasks the cluster's workers have run (Celery's own count)."""
    names = [f"{w.name}@{socket.gethostname()}" for w in cluster.workers]
    stats = broker.app.control.inspect(destination=names, timeout=5).stats() or {}
    return sum(s.get("total", {}).get("aaa.tick", 0) for s in stats.values())


def unacked_for_long(broker, cluster, redis, seconds: float = PATIENCE) -> int:
    """Messages of the cluster's queues that the Redis broker handed out more than
    ``seconds`` ago and still waits to have acknowledged; on RabbitMQ its
    consumer_timeout is the judge. The broker's database is shared with the other
    clusters of the test process: kombu's Redis channel keeps every unacknowledged
    message in one hash (``Channel.unacked_key``: tag -> [message, exchange, routing
    key]) with an index scored by when it was handed out (``unacked_index_key``); the
    routing key names the queue."""
    if broker.name != "redis":
        return 0
    from kombu.transport.redis import Channel

    tags = redis.zrangebyscore(Channel.unacked_index_key, "-inf", time.time() - seconds)
    ours = set(cluster.queues.values())
    held = [redis.hget(Channel.unacked_key, tag) for tag in tags]
    return sum(1 for raw in held if raw is not None and json.loads(raw)[2] in ours)


async def watch(broker, cluster, redis, stop: asyncio.Event) -> list[tuple[int, int]]:
    """(held, unacked for long) every half second until ``stop``."""
    seen = []
    while not stop.is_set():
        seen.append((await asyncio.to_thread(held, broker, cluster), unacked_for_long(broker, cluster, redis)))
        await asyncio.sleep(0.5)
    return seen


def test_a_deadline_and_an_expiry_longer_than_the_brokers_patience(on, arun, redis):
    broker, cluster = on

    async def main():
        async with make_engine(cluster.queues, app=broker.app) as engine:
            waits = await engine.start(loop(), {"task": script(turns=2, tool="gated")}, deadline=LONG)
            expires = await engine.start(loop(), {"task": script(turns=2, tool="gated_for_a_while")})
            stop = asyncio.Event()
            watcher = asyncio.ensure_future(watch(broker, cluster, redis, stop))
            try:
                ends = [(await run.result(timeout=60), await run.events()) for run in (waits, expires)]
            finally:
                stop.set()
            return await watcher, ends

    seen, [(timed_out, waits_log), (answered, expires_log)] = arun(main())

    assert len(seen) > 5 and set(seen) == {(0, 0)}  # nothing held, all along
    assert timed_out.outcome == "timeout"
    (done,) = [e for e in waits_log if e.type == RUN_COMPLETED]
    assert done.time.timestamp() >= timed_out.value["deadline"]  # at its deadline, not before
    (requested,) = [e for e in expires_log if e.type == APPROVAL_REQUESTED]
    (expired,) = [e for e in expires_log if e.type == APPROVAL_EXPIRED]
    assert expired.time.timestamp() >= requested.data["expires_at"]
    assert answered.outcome == "success"  # the model went on without the tool
    assert [w.proc.poll() for w in cluster.workers] == [None, None]  # no worker went down
    assert cluster.errors() == [], cluster.logs()
    assert ticks(broker, cluster) > 0  # this cluster's duty ran


def test_a_thousand_runs_waiting_a_day_hold_no_message(on, arun, redis):
    broker, cluster = on
    n = 1000

    async def main():
        async with make_engine(cluster.queues, app=broker.app) as engine:
            return [(await engine.start(Idle(), {}, deadline=DAY)).run_id for _ in range(n)]

    t0 = time.monotonic()
    run_ids = arun(main())
    rows = RunRecord.objects.using("postgres").filter(run_id__in=run_ids)
    end = time.monotonic() + 120
    while rows.filter(status="running").count() < n:  # every start delivered and validated
        assert time.monotonic() < end, f"{rows.filter(status='running').count()} of {n} running"
        time.sleep(0.2)
    print(f"\n{n} runs started and delivered on {broker.name} in {time.monotonic() - t0:.1f} s")

    assert held(broker, cluster) == 0
    # What is still unacknowledged is a delivery under way, which ends: none is held.
    end = time.monotonic() + 60
    while unacked_for_long(broker, cluster, redis, 0.0):
        assert time.monotonic() < end, "messages still unacknowledged after a minute"
        time.sleep(0.2)
    # Each timer is a column of its run's row, due a day from now.
    due = list(rows.values_list("due_at", flat=True))
    assert len(due) == n and min(due) > time.time() + DAY - 600
    assert [w.proc.poll() for w in cluster.workers] == [None, None]
