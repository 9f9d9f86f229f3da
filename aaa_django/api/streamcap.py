"""How many event streams one user holds open at once, counted across processes.

Each open stream holds a *slot*: a key ``aaa:streams:<user>:<i>`` (``i`` below
``AAA["API_STREAMS_PER_USER"]``) in the site's default cache, taken with
``cache.add`` (atomic in Redis, Memcached and the database cache) for
:data:`LEASE` seconds and renewed while the stream runs. A stream that ends gives its
slot back; one that dies without cleanup (a killed process) frees it when its lease
runs out. With a per-process cache (local memory) each process counts alone: system
check aaa.W020.
"""

from __future__ import annotations

import uuid

from django.core.cache import cache

#: seconds a slot lives unless renewed (a stream renews it every third of this)
LEASE = 60.0


class Slot:
    """One open stream's place in its user's count."""

    def __init__(self, key: str, token: str) -> None:
        self.key, self.token = key, token

    def renew(self) -> None:
        """Keep the slot (take it again if it had lapsed and is free)."""
        if cache.get(self.key) == self.token:
            cache.touch(self.key, LEASE)
        else:
            cache.add(self.key, self.token, LEASE)

    def release(self) -> None:
        if cache.get(self.key) == self.token:
            cache.delete(self.key)


def acquire(user_pk: object, limit: int) -> Slot | None:
    """A free slot of the user's ``limit``, or None when every one is held."""
    token = uuid.uuid4().hex
    for i in range(limit):
        key = f"aaa:streams:{user_pk}:{i}"
        if cache.add(key, token, LEASE):
            return Slot(key, token)
    return None
