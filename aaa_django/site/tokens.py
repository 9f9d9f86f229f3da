"""The site's live tokens (``AAA["STREAM_TOKENS"]``): where its model handlers publish
token deltas and its event streams read them.

With the Celery bus, Redis pub/sub (:class:`~aaa_django.store.tokens.RedisTokens` on
the bus's Redis), since the worker that calls the model is not the web process that
streams; with the in-process bus, the process's own fan-out
(:class:`~aaa_django.llm.deltas.LocalTokens`). Off: no sink, so the model clients do
not stream.
"""

from __future__ import annotations

import json
import logging

from aaa_django.conf import aaa_settings, redis_url
from aaa_django.llm.deltas import LocalTokens, TokenDelta, TokenSubscription
from aaa_django.store.tokens import RedisTokens  # (redis itself: imported when used)

log = logging.getLogger("aaa_django.tokens")

#: the process's in-memory fan-out (the in-process bus)
LOCAL = LocalTokens()
_redis: dict[str, RedisTokens] = {}


def site_tokens() -> LocalTokens | RedisTokens | None:
    """The site's delta sink and feed; None when ``AAA["STREAM_TOKENS"]`` is off."""
    conf = aaa_settings()
    if not conf["STREAM_TOKENS"]:
        return None
    if conf["BUS"] != "celery":
        return LOCAL
    url = redis_url()
    if not url:
        raise RuntimeError("live tokens on the Celery bus need Redis: set AAA['REDIS_URL'] or a redis:// broker")
    tokens = _redis.get(url)
    if tokens is None:
        tokens = _redis[url] = RedisTokens(url)
    return tokens


def subscribe(run_id: str) -> TokenSubscription | None:
    """A subscription to the run's deltas; None when tokens are off or cannot be read
    now (the events are streamed without them)."""
    tokens = site_tokens()
    if tokens is None:
        return None
    try:
        return tokens.subscribe(run_id)
    except Exception as exc:  # Redis down: the stream goes on with events only
        log.warning("live tokens of run %s are not read: %s", run_id, exc)
        return None


def sse_message(delta: TokenDelta) -> str:
    """A delta as a Server-Sent Events message: ``event: token``, no ``id`` (a
    reconnection's ``Last-Event-ID`` stays the last event's), ``data`` its dict."""
    return f"event: token\ndata: {json.dumps(delta.to_dict(), separators=(',', ':'))}\n\n"
