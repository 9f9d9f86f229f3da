"""Export and import: a run as one JSON Lines file, its blobs inlined or beside it.

The file, one JSON object per line:

    {"aaa_export": 1, "run": "run-…", "events": 12, "blobs": "inline", "exported_at": "…"}
    {"event": {"id": …, "stream": …, "seq": 1, "type": "aaa.run.started", …}}
    {"blob": {"sha256": …, "size": …, "media_type": …, "namespace": …}, "base64": "…"}
    {"event": {…}}
    …

Events are exactly as stored (claim-checked ones keep their stub and refs); with
``"blobs": "inline"`` each blob's bytes follow the first event that refers to it,
with ``"beside"`` they are files named by their SHA-256 in a directory next to the
file (``<file>.blobs/``), with ``"none"`` they are left out (a replay then cannot
read claim-checked events).

An import keeps every id (run, events, blob refs) and checks everything before it
writes anything: the header and the event count, one stream, dense seqs from 1, an
``aaa.run.started`` first, each blob's bytes against its ref's SHA-256 and size, and
each ref in the run's own blobs (its namespace, the run's id; or, from a store without
namespaces, a payload naming the run): an import never shares another run's blob.
Then it stores the blobs and appends the log in one transaction; if the run or any
of its event ids exists on this site, nothing is kept. The run's owner is a user of
the site that exported it: the import names this site's owner instead (or none). An
imported run is not driven: ``engine.resume([run_id])`` adopts an unfinished one. A
blob store without namespaces (spec 004's four methods) takes the blobs of an export
whose refs name none (one from a site with such a store); a run whose blobs are in
namespaces is refused there, before anything is written.

Used by ``manage.py aaa_export`` / ``aaa_import``, the REST API (``GET
/runs/{id}/export``, ``POST /imports``) and the admin (Export, Import).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import transaction

from aaa_django.data import BlobRef, BlobStore, NamespacedBlobStore, hydrate, is_claimed
from aaa_django.data.claims import STREAM_KEY
from aaa_django.data.errors import BlobError
from aaa_django.events import ConcurrencyError, Event
from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import RUN_STARTED

from .database import DjangoEventStore

FORMAT = 1
MODES = ("inline", "beside", "none")
#: events read per query while exporting
PAGE = 1000
#: the media type of an export (JSON Lines)
MEDIA_TYPE = "application/jsonl"


class ExchangeError(ValueError):
    """An export that cannot be read or imported; the message says why. Nothing was
    written."""


class ExchangeConflict(ExchangeError):
    """The run (or one of its event ids) exists on this site already."""


# -- writing ----------------------------------------------------------------------------


def _line(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def export_lines(
    run_id: str,
    events: Iterable[Event],
    count: int,
    *,
    blob: Callable[[BlobRef], bytes] | None = None,
    mode: str = "inline",
    beside: Callable[[BlobRef, bytes], None] | None = None,
) -> Iterator[str]:
    """The lines of an export of ``count`` events. ``blob(ref)`` reads a blob's
    (verified) bytes; with ``mode="beside"``, ``beside(ref, data)`` stores each one."""
    if mode not in MODES:
        raise ValueError(f"blobs must be one of {MODES}, not {mode!r}")
    yield _line(
        {
            "aaa_export": FORMAT,
            "run": run_id,
            "events": count,
            "blobs": mode,
            "exported_at": datetime.now(UTC).isoformat(),
        }
    )
    written: set[str] = set()
    for e in events:
        yield _line({"event": e.to_dict()})
        if mode == "none":
            continue
        for ref in e.blobs:
            if ref.key in written:
                continue
            written.add(ref.key)
            if blob is None:
                raise ExchangeError("the run has blobs and there is no blob store")
            data = blob(ref)
            if mode == "inline":
                yield _line({"blob": ref.to_dict(), "base64": base64.b64encode(data).decode()})
            elif beside is None:
                raise ValueError('blobs="beside" needs beside=')
            else:
                beside(ref, data)


def run_events(store: DjangoEventStore, run_id: str) -> Iterator[Event]:
    """The run's events, read page by page."""
    after = 0
    while True:
        page = store.read_sync(run_id, after=after, limit=PAGE)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1].seq or after + len(page)  # a stored event has its seq


def export_run(
    run_id: str,
    *,
    using: str = "default",
    blobs: BlobStore | None = None,
    mode: str = "inline",
    beside: Path | None = None,
) -> Iterator[str]:
    """The lines of the export of ``run_id`` from database ``using``, its blobs read
    from ``blobs`` (a BlobStore); ``beside``: the directory for ``mode="beside"``."""
    store = DjangoEventStore(using)
    head = store.head_sync(run_id)
    if head is None:
        raise ExchangeError(f"no run {run_id!r} on this site")
    if (
        mode != "none"
        and blobs is None
        and EventRecord.objects.using(using).filter(stream=run_id).exclude(blobs=[]).exists()
    ):
        raise ExchangeError(
            "the run has blobs and this site has no blob store (AAA['BLOB_STORAGE']): export it with blobs 'none'"
        )
    put = None
    if mode == "beside":
        if beside is None:
            raise ValueError("mode 'beside' needs the directory")
        beside.mkdir(parents=True, exist_ok=True)
        put = _Beside(beside)
    return export_lines(
        run_id, run_events(store, run_id), head[0], blob=blobs.get if blobs is not None else None, mode=mode, beside=put
    )


class _Beside:
    """Writes an export's blobs as files named by their hash."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, ref: BlobRef, data: bytes) -> None:
        (self.directory / ref.sha256).write_bytes(data)


def blob_dir(path: Path) -> Path:
    """Where ``mode="beside"`` puts the blobs of the export at ``path``."""
    return path.with_name(path.name + ".blobs")


# -- reading ----------------------------------------------------------------------------


@dataclass
class RunExport:
    """A checked export: the run's events as stored, and its blobs' bytes by key."""

    run_id: str
    events: list[Event]
    blobs: dict[str, bytes] = field(default_factory=dict)
    mode: str = "inline"

    def refs(self) -> dict[str, BlobRef]:
        return {ref.key: ref for e in self.events for ref in e.blobs}

    def hydrated(self) -> list[Event]:
        """The events with their claim-checked payloads restored (for a replay)."""
        store = _Blobs(self.blobs)
        out = []
        for e in self.events:
            if is_claimed(e.data):
                if self.mode == "none":
                    raise ExchangeError(
                        f"event {e.seq} is claim-checked and the export has no blobs: export it with its blobs"
                    )
                e = replace(e, data=hydrate(e.data, e.blobs[-1], store=store))
            out.append(e)
        return out


class _Blobs:
    """The export's blobs as a read-only BlobStore (``get`` verifies, as every store)."""

    def __init__(self, blobs: dict[str, bytes]) -> None:
        self._blobs = blobs

    def get(self, ref: BlobRef) -> bytes:
        return ref.verify(self._blobs[ref.key])


def read_export(lines: Iterable[str | bytes], *, beside: Path | None = None) -> RunExport:
    """Parse and check an export (see the module's docstring); ``beside`` is the blob
    directory of a ``"beside"`` export. Raises :class:`ExchangeError` with the reason."""
    it = iter(lines)
    header = _object(next(it, None), 1)
    if header is None or header.get("aaa_export") != FORMAT:
        raise ExchangeError(f"not a run export of format {FORMAT} (the first line is its header)")
    run_id, count, mode = header.get("run"), header.get("events"), header.get("blobs", "inline")
    if not isinstance(run_id, str) or not run_id or not isinstance(count, int) or mode not in MODES:
        raise ExchangeError("the header needs a run id, an event count and a blob mode")
    events: list[Event] = []
    blobs: dict[str, bytes] = {}
    for n, raw in enumerate(it, start=2):
        obj = _object(raw, n)
        if obj is None:
            continue
        if "event" in obj:
            events.append(_event(obj["event"], n))
        elif "blob" in obj:
            ref, data = _blob(obj, n)
            blobs[ref.key] = data
        else:
            raise ExchangeError(f"line {n}: neither an event nor a blob")
    if len(events) != count:
        raise ExchangeError(f"the header announces {count} events, the file has {len(events)} (a truncated file?)")
    export = RunExport(run_id, events, blobs, mode)
    _check_log(export)
    if mode == "beside":
        if beside is None:
            raise ExchangeError("the blobs are beside the file: give their directory")
        for key, ref in export.refs().items():
            path = beside / ref.sha256
            if not path.is_file():
                raise ExchangeError(f"blob {ref.sha256} is missing from {beside}")
            blobs[key] = path.read_bytes()
    if mode != "none":
        for key, ref in export.refs().items():
            if key not in blobs:
                raise ExchangeError(f"blob {ref.sha256} (event refs) is missing from the export")
            try:
                ref.verify(blobs[key])
            except BlobError as exc:
                raise ExchangeError(f"blob {ref.sha256} does not match its hash: {exc}") from None
    return export


def _object(raw: str | bytes | None, n: int) -> dict[str, Any] | None:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ExchangeError(f"line {n}: not UTF-8") from None
    if not raw.strip():
        return None
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise ExchangeError(f"line {n}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ExchangeError(f"line {n}: not a JSON object")
    return obj


def _event(d: Any, n: int) -> Event:
    try:
        e = Event.from_dict(d)
    except (KeyError, TypeError, ValueError) as exc:
        raise ExchangeError(f"line {n}: not an event ({exc})") from None
    if e.time.tzinfo is None:
        raise ExchangeError(f"line {n}: the event's time has no time zone")
    return e


def _blob(obj: dict[str, Any], n: int) -> tuple[BlobRef, bytes]:
    try:
        ref = BlobRef.from_dict(obj["blob"])
        data = base64.b64decode(obj.get("base64", ""), validate=True)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise ExchangeError(f"line {n}: not a blob ({exc})") from None
    try:
        return ref, ref.verify(data)
    except BlobError as exc:
        raise ExchangeError(f"line {n}: blob {ref.sha256} does not match its hash: {exc}") from None


def _check_log(export: RunExport) -> None:
    events = export.events
    if not events or events[0].type != RUN_STARTED:
        raise ExchangeError("a run's log starts with aaa.run.started")
    for i, e in enumerate(events, start=1):
        if e.stream != export.run_id:
            raise ExchangeError(f"event {e.id} belongs to {e.stream!r}, not {export.run_id!r}")
        if e.seq != i:
            raise ExchangeError(f"event {e.id} has seq {e.seq}; seqs must run 1, 2, 3, …")
    ids = [e.id for e in events]
    if len(set(ids)) != len(ids):
        raise ExchangeError("an event id appears twice")


# -- importing --------------------------------------------------------------------------


def _own_blob(export: RunExport, ref: BlobRef, data: bytes | None) -> None:
    """Refuse a ref outside the imported run's own blobs: a run's blobs are in its
    namespace (its id), or, put in a store without namespaces, in none with the run's id
    inside the payload (``{"$stream": run, "data": ...}``). A ref into another run's
    namespace would make the import share that run's blob (and erasing either would
    take it from the other)."""
    if ref.namespace == export.run_id:
        return
    where = f"{ref.namespace}/{ref.sha256}" if ref.namespace else ref.sha256
    if ref.namespace:
        raise ExchangeError(
            f"blob {where} is outside the run's namespace {export.run_id!r}: an import stores only the run's own blobs"
        )
    try:
        payload = json.loads(data) if data is not None else None
    except ValueError:
        payload = None
    if not (
        isinstance(payload, dict) and payload.keys() == {STREAM_KEY, "data"} and payload[STREAM_KEY] == export.run_id
    ):
        raise ExchangeError(
            f"blob {where} names no namespace and is not a payload of run "
            f"{export.run_id!r}: an import stores only the run's own blobs"
        )


def import_run(
    export: RunExport, *, using: str = "default", blobs: Any = None, owner: str | None = None
) -> list[Event]:
    """Store ``export`` on database ``using`` (its blobs in ``blobs``: a BlobStore,
    namespaced or not), owned by ``owner`` (a user pk as text, or None). All or
    nothing; returns the stored events."""
    store = DjangoEventStore(using)
    refs = export.refs()
    if refs and export.mode == "none":
        raise ExchangeError("the export has no blobs and its events refer to some")
    if refs and blobs is None:
        raise ExchangeError("the run has blobs and this site stores none (AAA['BLOB_STORAGE'])")
    namespaced = isinstance(blobs, NamespacedBlobStore)
    if not namespaced and any(ref.namespace for ref in refs.values()):
        # A store without namespaces cannot keep the refs the events name; and two runs'
        # identical payloads would be one blob, which erasing either run would take.
        raise ExchangeError(
            "the run's blobs are in namespaces and this site's blob store "
            "keeps none: import it where the blob store keeps namespaces"
        )
    for key, ref in refs.items():
        _own_blob(export, ref, export.blobs.get(key))
    if store.head_sync(export.run_id) is not None:
        raise ExchangeConflict(f"run {export.run_id} exists on this site already")
    started = export.events[0]
    events = [replace(started, data={**started.data, "owner": owner}), *export.events[1:]]
    added = []
    try:
        for key, ref in refs.items():
            if not blobs.exists(ref):
                if namespaced:
                    stored = blobs.put(export.blobs[key], ref.media_type, namespace=ref.namespace)
                else:
                    stored = blobs.put(export.blobs[key], ref.media_type)
                added.append(stored)
        with transaction.atomic(using=using):
            try:
                stored_events = store.append_sync(events, expected_seq=0)
            except ConcurrencyError:
                stored_events = []  # an id stored already moved the numbering: said below
            if len(stored_events) != len(events):
                raise ExchangeConflict(
                    f"run {export.run_id}: some of its event ids exist on this "
                    "site already (or the run was written meanwhile)"
                )
    except BaseException:
        for ref in added:
            blobs.delete(ref)
        raise
    return stored_events
