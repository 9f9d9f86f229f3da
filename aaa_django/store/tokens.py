"""Live tokens across processes: Redis pub/sub, a channel per run.

A Celery worker's model handler publishes each :class:`~aaa_django.llm.deltas.TokenDelta`
on ``{prefix}:tokens:{run_id}``; an event stream in a web process subscribes to its
run's channel before it reads the log, so it gets every delta sent from then on.
Pub/sub keeps nothing: a delta no one listens to is gone, which is what deltas are for
(the reply's ``aaa.llm.completed`` in the log has the whole text).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from aaa_django.llm.deltas import TokenDelta

log = logging.getLogger("aaa_django.tokens")

#: seconds a new subscription waits for Redis to confirm it
SUBSCRIBE_TIMEOUT = 5.0


class RedisTokens:
    """A :class:`~aaa_django.llm.deltas.DeltaSink` and
    :class:`~aaa_django.llm.deltas.TokenFeed` on the Redis at ``url``."""

    def __init__(self, url: str, *, prefix: str = "aaa") -> None:
        import redis

        self.url = url
        self.prefix = prefix
        self.client = redis.Redis.from_url(url)
        self._errors = redis.RedisError
        self._warned_at = 0.0

    def __repr__(self) -> str:
        return f"RedisTokens({self.url!r}, prefix={self.prefix!r})"

    def channel(self, run_id: str) -> str:
        return f"{self.prefix}:tokens:{run_id}"

    def publish(self, delta: TokenDelta) -> None:
        # A synchronous PUBLISH on the engine's loop: one round trip to a near Redis
        # per delta, as cheap as handing it to a thread. A lost delta costs nothing.
        try:
            self.client.publish(self.channel(delta.run_id), json.dumps(delta.to_dict()))
        except self._errors as exc:
            self.warn(f"a token delta of run {delta.run_id} was not published: {exc}")

    def subscribe(self, run_id: str) -> RedisSubscription:
        return RedisSubscription(self, run_id)

    def warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at > 60:  # once a minute, not once per delta
            self._warned_at = now
            log.warning("%s", message)


class RedisSubscription:
    """One listener's deltas of one run (a pub/sub connection of its own)."""

    def __init__(self, owner: RedisTokens, run_id: str) -> None:
        self.owner = owner
        self.pubsub: Any = owner.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(owner.channel(run_id))
        # Confirmed before the caller reads the log: a delta published after that
        # read started is ours.
        self.pubsub.get_message(ignore_subscribe_messages=False, timeout=SUBSCRIBE_TIMEOUT)

    def wait(self, timeout: float) -> list[TokenDelta]:
        out: list[TokenDelta] = []
        try:
            message = self.pubsub.get_message(timeout=timeout)
            while message is not None:
                if message.get("type") == "message":
                    try:
                        out.append(TokenDelta.from_dict(json.loads(message["data"])))
                    except ValueError:
                        pass  # not ours: skipped
                message = self.pubsub.get_message(timeout=0.0)
        except self.owner._errors as exc:
            # The events go on without live tokens; Redis down is the bus's outage to report.
            self.owner.warn(f"live tokens are not read: {exc}")
            time.sleep(timeout)
        return out

    def close(self) -> None:
        try:
            self.pubsub.close()
        except self.owner._errors:
            pass
