"""``RedisEventStore``: the EventStore on Redis, for sites that want the log there.

Layout (every key under one hash tag, ``{prefix}``, so a Redis Cluster keeps a log in
one slot and the scripts may touch all of its keys):

===========================  ====================================================
``{prefix}:ev:<stream>``     a LIST of the stream's events; position i holds seq i+1
``{prefix}:ids``             a HASH event id -> stream (ids are unique in the log)
``{prefix}:streams``         a SET of the streams that hold events
``{prefix}:closed``          a SET of the streams whose run has completed
``{prefix}:snap:<stream>``   a HASH: ``seq|<name>|<version>`` -> the snapshot's
                             seq, ``val|<name>|<version>`` -> ``[event_id, state]``
===========================  ====================================================

An event is stored as the JSON array ``[id, type, causation, time, tenant, blobs,
data]`` with ``data`` spliced in as the exact text :func:`check_event` produced, so
a read gives the same values, types and key order as every other backend. ``seq`` is
the position in the list: it cannot have gaps. Appends and snapshot saves are Lua
scripts, atomic on the server: the head check, the id check and the writes happen
with no other client in between.

The redis-py client is synchronous (one thread-safe connection pool, usable from any
event loop); the async protocol runs its calls in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from aaa_django.events import ClosedStreamError, ConcurrencyError, Event, Snapshot
from aaa_django.events.event import decode_blobs, encode_blobs
from aaa_django.events.store import closed_reason, prepare_batch

# KEYS: events list, ids hash, streams set, closed set. ARGV: stream, expected seq
# ('' = any), then (id, claimed seq or '', type, record) per event. Returns {'ok',
# head, i1, i2...} (1-based positions of the stored events in the batch),
# {'conflict', message} or {'closed', 'ended' or the refused first type} (see
# events.store.check_open).
_APPEND = """
local head = redis.call('LLEN', KEYS[1])
local expected = ARGV[2]
if expected ~= '' and tonumber(expected) ~= head then
  return {'conflict', 'stream head is ' .. head .. ', expected ' .. expected}
end
local closed = redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 1
local ends = false
local fresh = {}
local nxt = head
for i = 3, #ARGV, 4 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    nxt = nxt + 1
    local claimed = ARGV[i + 1]
    if claimed ~= '' and tonumber(claimed) ~= nxt then
      return {'conflict', 'event ' .. ARGV[i] .. ' claims seq ' .. claimed ..
              ' but the next seq is ' .. nxt}
    end
    local t = ARGV[i + 2]
    if closed then return {'closed', 'ended'} end
    if nxt == 1 and string.sub(t, 1, 4) == 'aaa.' and t ~= 'aaa.run.started' then
      return {'closed', t}
    end
    if t == 'aaa.run.completed' then
      closed = true
      ends = true
    end
    fresh[#fresh + 1] = i
  end
end
local out = {'ok', head}
for _, i in ipairs(fresh) do
  redis.call('RPUSH', KEYS[1], ARGV[i + 3])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[1])
  out[#out + 1] = (i - 3) / 4 + 1
end
if #fresh > 0 then redis.call('SADD', KEYS[3], ARGV[1]) end
if ends then redis.call('SADD', KEYS[4], ARGV[1]) end
return out
"""

# KEYS: snapshot hash. ARGV: seq field, value field, seq, value. 1 if stored.
_SAVE_SNAPSHOT = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and tonumber(cur) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3], ARGV[2], ARGV[4])
return 1
"""

# KEYS: events list, ids hash, streams set, snapshot hash, closed set. ARGV: stream.
_ERASE = """
local n = redis.call('LLEN', KEYS[1])
local batch = 500
for start = 0, n - 1, batch do
  local records = redis.call('LRANGE', KEYS[1], start, start + batch - 1)
  local ids = {}
  for _, r in ipairs(records) do ids[#ids + 1] = cjson.decode(r)[1] end
  if #ids > 0 then redis.call('HDEL', KEYS[2], unpack(ids)) end
end
redis.call('DEL', KEYS[1], KEYS[4])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[5], ARGV[1])
return n
"""

_PAGE = 500  # events per LRANGE when a tenant filter has to scan


class RedisEventStore:
    """An :class:`~aaa_django.events.EventStore` on Redis.

    ``RedisEventStore("redis://host:6379/0", prefix="aaa")``, or pass a ``client``
    (a synchronous ``redis.Redis``; responses must not be decoded). Two stores with
    the same server, database and prefix are the same log.
    """

    def __init__(self, url: str | None = None, *, prefix: str = "aaa", client: Any = None) -> None:
        if client is None:
            import redis

            if url is None:
                raise ValueError("RedisEventStore needs a url or a client")
            client = redis.Redis.from_url(url)
        self.client = client
        self.prefix = prefix
        self._tag = "{" + prefix + "}"
        kw = client.connection_pool.connection_kwargs
        where = kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
        self.cache_key = f"redis:{where}/{kw.get('db', 0)}:{prefix}"
        self._append = client.register_script(_APPEND)
        self._save = client.register_script(_SAVE_SNAPSHOT)
        self._erase = client.register_script(_ERASE)

    def __repr__(self) -> str:
        return f"RedisEventStore({self.cache_key!r})"

    # -- keys -----------------------------------------------------------------------

    def _events_key(self, stream: str) -> str:
        return f"{self._tag}:ev:{stream}"

    def _snap_key(self, stream: str) -> str:
        return f"{self._tag}:snap:{stream}"

    @property
    def _ids_key(self) -> str:
        return f"{self._tag}:ids"

    @property
    def _streams_key(self) -> str:
        return f"{self._tag}:streams"

    @property
    def _closed_key(self) -> str:
        return f"{self._tag}:closed"

    # -- the async protocol -----------------------------------------------------------

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        return await asyncio.to_thread(self.append_sync, events, expected_seq=expected_seq)

    async def read(
        self, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
    ) -> list[Event]:
        return await asyncio.to_thread(self.read_sync, stream, after=after, limit=limit, tenant=tenant)

    async def head(self, stream: str) -> tuple[int, str] | None:
        return await asyncio.to_thread(self.head_sync, stream)

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None:
        return await asyncio.to_thread(self.load_snapshot_sync, stream, name, version)

    async def read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        return await asyncio.to_thread(self.read_from_snapshot_sync, stream, name, version)

    async def save_snapshot(self, snapshot: Snapshot) -> bool:
        return await asyncio.to_thread(self.save_snapshot_sync, snapshot)

    async def erase(self, stream: str) -> int:
        return await asyncio.to_thread(self.erase_sync, stream)

    async def streams(self) -> list[str]:
        return await asyncio.to_thread(self.streams_sync)

    # -- events -------------------------------------------------------------------------

    def append_sync(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        stream, batch, texts = prepare_batch(events)  # raises before any write
        if not batch:
            return []
        args: list[Any] = [stream, "" if expected_seq is None else int(expected_seq)]
        for e, text in zip(batch, texts):
            args += [e.id, "" if e.seq is None else e.seq, e.type, _record(e, text)]
        reply = self._append(
            keys=[self._events_key(stream), self._ids_key, self._streams_key, self._closed_key],
            args=args,
        )
        status = reply[0].decode()
        if status == "conflict":
            raise ConcurrencyError(reply[1].decode())
        if status == "closed":
            what = reply[1].decode()
            raise ClosedStreamError(closed_reason(stream, ended=what == "ended", type=what))
        head = int(reply[1])
        return [
            # What the caller gets back is what a reader will get: the decoded text.
            replace(batch[i - 1], seq=head + n, data=json.loads(texts[i - 1]))
            for n, i in enumerate((int(x) for x in reply[2:]), start=1)
        ]

    def read_sync(
        self, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
    ) -> list[Event]:
        after = max(after, 0)
        if limit is not None and limit <= 0:
            return []
        key = self._events_key(stream)
        if tenant is None:
            stop = -1 if limit is None else after + limit - 1
            return [_event(stream, after + i + 1, r) for i, r in enumerate(self.client.lrange(key, after, stop))]
        out: list[Event] = []
        start = after
        while limit is None or len(out) < limit:
            page = self.client.lrange(key, start, start + _PAGE - 1)
            for i, r in enumerate(page):
                e = _event(stream, start + i + 1, r)
                if e.tenant == tenant:
                    out.append(e)
                    if limit is not None and len(out) == limit:
                        break
            if len(page) < _PAGE:
                break
            start += _PAGE
        return out

    def head_sync(self, stream: str) -> tuple[int, str] | None:
        pipe = self.client.pipeline(transaction=True)
        key = self._events_key(stream)
        pipe.llen(key)
        pipe.lindex(key, -1)
        n, last = pipe.execute()
        if not n or last is None:
            return None
        return int(n), json.loads(last)[0]

    def erase_sync(self, stream: str) -> int:
        keys = [self._events_key(stream), self._ids_key, self._streams_key, self._snap_key(stream), self._closed_key]
        return int(self._erase(keys=keys, args=[stream]))

    def streams_sync(self) -> list[str]:
        return sorted(s.decode() for s in self.client.smembers(self._streams_key))

    # -- snapshots ------------------------------------------------------------------------

    def load_snapshot_sync(self, stream: str, name: str, version: int) -> Snapshot | None:
        seq, value = self.client.hmget(self._snap_key(stream), *_snap_fields(name, version))
        if seq is None or value is None:
            return None
        event_id, state = json.loads(value)
        return Snapshot(stream, name, version, int(seq), event_id, state)

    def read_from_snapshot_sync(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        """The snapshot and the log from its seq on (one thread hop, two commands)."""
        snap = self.load_snapshot_sync(stream, name, version)
        return snap, ([] if snap is None else self.read_sync(stream, after=snap.seq - 1))

    def save_snapshot_sync(self, snapshot: Snapshot) -> bool:
        """Store ``snapshot`` unless one at the same or a later seq is stored already
        (one script: the compare and the write are atomic)."""
        seq_field, val_field = _snap_fields(snapshot.name, snapshot.version)
        value = json.dumps([snapshot.event_id, snapshot.state], ensure_ascii=False)
        stored = self._save(
            keys=[self._snap_key(snapshot.stream)],
            args=[seq_field, val_field, int(snapshot.seq), value],
        )
        return bool(stored)


def _snap_fields(name: str, version: int) -> tuple[str, str]:
    return f"seq|{name}|{version}", f"val|{name}|{version}"


def _record(e: Event, data_text: str) -> str:
    head = json.dumps(
        [e.id, e.type, e.causation, e.time.isoformat(), e.tenant, encode_blobs(e.blobs)],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return head[:-1] + "," + data_text + "]"


def _event(stream: str, seq: int, record: bytes) -> Event:
    id_, type_, causation, time_, tenant, blobs, data = json.loads(record)
    return Event(
        id=id_,
        stream=stream,
        seq=seq,
        type=type_,
        data=data,
        causation=causation,
        time=datetime.fromisoformat(time_),
        blobs=decode_blobs(blobs) if blobs else (),
        tenant=tenant,
    )
