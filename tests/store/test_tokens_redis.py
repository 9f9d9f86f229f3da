"""Live tokens across processes: Redis pub/sub, a channel per run. A subscriber gets
the deltas of its run published by another client (another process's) after it
subscribed, in order, and nothing of other runs; closed, it gets nothing more."""

from __future__ import annotations

import pytest

from aaa_django.llm.deltas import TokenDelta
from aaa_django.store.tokens import RedisTokens

pytestmark = pytest.mark.redis


def test_a_subscriber_gets_its_runs_deltas_from_another_client(redis_url):
    web, worker = RedisTokens(redis_url, prefix="aaa-test-tokens"), RedisTokens(redis_url, prefix="aaa-test-tokens")
    worker.publish(TokenDelta("r1", "q1", 0, "before"))  # no one listens: gone
    sub = web.subscribe("r1")
    sent = [TokenDelta("r1", "q1", i, t) for i, t in enumerate(["Hel", "lo", "!"])]
    worker.publish(TokenDelta("r2", "q2", 0, "another run"))
    for d in sent:
        worker.publish(d)
    got: list[TokenDelta] = []
    while len(got) < len(sent) and (more := sub.wait(5)):
        got += more
    assert got == sent
    assert sub.wait(0) == []
    sub.close()
    worker.publish(TokenDelta("r1", "q1", 3, "late"))
    assert web.client.pubsub_numsub(web.channel("r1")) == [(web.channel("r1").encode(), 0)]
