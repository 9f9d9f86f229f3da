"""Event ids: random (time-ordered) for roots, deterministic for derived events.

A derived event's id is a pure function of what it derives from, so deriving the same
event twice (after a redelivery, in two workers) yields the same id, and the store
absorbs the second append. That is what makes at-least-once delivery safe.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

# Fixed namespace for uuid5: changing it would change every derived id ever written.
_NAMESPACE = uuid.UUID("6f3f1c8e-7d0b-4c55-9a6e-2b8f0b5a1d11")
_PREFIX = _NAMESPACE.bytes
#: the bits uuid5 sets: version 5, RFC 4122 variant
_KEEP = ~((0xF000 << 64) | (0xC000 << 48))
_SET = (5 << 76) | (0x8000 << 48)
_sha1 = hashlib.sha1


def new_id() -> str:
    """A new random id: a UUIDv7 (RFC 9562), so ids sort roughly by creation time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return str(uuid.UUID(int=value))


def derive_id(parent_id: str, *parts: object) -> str:
    """The deterministic id of an event derived from ``parent_id``.

    ``parts`` say *what* is derived (an event type, a call id, an attempt number...);
    the same parent and parts always give the same id.
    """
    if not parent_id:
        raise ValueError("derive_id needs the id of the event it derives from")
    key = "\x1f".join([parent_id, *(str(p) for p in parts)])
    # ``str(uuid.uuid5(_NAMESPACE, key))``, the same text (a test compares them) in a
    # quarter of the time: a run's step derives one or two ids per delivery.
    value = (int.from_bytes(_sha1(_PREFIX + key.encode()).digest()[:16], "big") & _KEEP) | _SET
    x = "%032x" % value  # noqa: UP031 (the cheapest of the ways to format it)
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"
