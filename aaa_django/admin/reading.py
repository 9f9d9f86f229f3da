"""What the admin reads through the library: folded projections, events, blobs.

Nothing here writes events or blobs. Projections are folded by
:meth:`Projection.load_info` over a reader that hydrates claim-checked events from
the blob store (verified), exactly as the engine's own view does, so the state shown
is the state the algorithm saw; the library may save a snapshot while doing so
(derived data, as any reader does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync

from aaa_django.data import BlobReader, BlobRef, is_claimed
from aaa_django.data.errors import BlobError, BlobIntegrityError, BlobNotFoundError
from aaa_django.events import Event, EventReader, Projection, default_cache
from aaa_django.llm.conversation import CONVERSATION
from aaa_django.reading import projections as registry
from aaa_django.reading.hydrated import hydrated, hydrating
from aaa_django.runtime import RUNMETA
from aaa_django.runtime import registry as algorithms
from aaa_django.site.engines import site_blobs
from aaa_django.store import DjangoEventStore

#: bytes of a blob shown in a preview
PREVIEW_BYTES = 64 * 1024
#: characters of a folded state shown on the run page
STATE_CHARS = 64 * 1024
#: a projection without snapshots is folded on request only past this many events
#: (each read would replay the whole log until the process's holder is warm)
EAGER_REPLAY_LIMIT = 2_000


# -- events ------------------------------------------------------------------------------


def event_at(run_id: str, seq: int | None, using: str = "default") -> Event | None:
    """The run's event at ``seq`` as stored (one indexed read), or None."""
    if not seq:
        return None
    found = DjangoEventStore(using).read_sync(run_id, after=seq - 1, limit=1)
    return found[0] if found and found[0].seq == seq else None


def data_of(event: Event | None) -> Any:
    """The event's data, hydrated when claim-checked (None if it cannot be read)."""
    if event is None:
        return None
    if not is_claimed(event.data):
        return event.data
    try:
        return hydrated(event, site_blobs()).data
    except BlobError as exc:
        return {"$error": f"{type(exc).__name__}: {exc}"}


# -- projections -------------------------------------------------------------------------


@dataclass
class Folded:
    """A projection's state for the page, and where it came from."""

    name: str
    short: str
    state: object = None  # JSON-ready
    seq: int = 0
    source: str = ""
    base_seq: int = 0
    folded: int = 0
    error: str | None = None
    raw: Any = None  # the state object (RUNMETA's is used by the summary)
    #: not folded: why (the page offers to fold it)
    deferred: str | None = None

    @property
    def full_text(self) -> str:
        return json.dumps(self.state, indent=2, ensure_ascii=False, sort_keys=False, default=str)

    @property
    def text(self) -> str:
        text = self.full_text
        if len(text) <= STATE_CHARS:
            return text
        return text[:STATE_CHARS] + f"\n… cut: the state is {len(text):,} characters long"


def fold_all(
    run_id: str,
    *,
    at: int | None = None,
    using: str = "default",
    events: int = 0,
    eager: bool = False,
    algorithm: str | None = None,
) -> list[Folded]:
    """The registered projections over the run (now, or as of event ``at``).

    Folded: RUNMETA, the conversation, the projections the run's ``algorithm``
    declares, and the site's own (``AAA["PROJECTIONS"]``). The other built-ins are
    listed unfolded (``deferred``), one click away, so a page costs queries for what
    the run uses, not for every algorithm the library ships. A projection that cannot
    be folded (a tampered blob in its way, a fold that raises) is reported on its own
    line; the others are still shown. Unless ``eager``, a projection that keeps no
    snapshots is not folded over a run of more than ``EAGER_REPLAY_LIMIT`` events.

    In order: RUNMETA, the algorithm's own projections, the other folded ones, the
    deferred ones; by name within each.
    """
    reader = hydrating(DjangoEventStore(using), site_blobs())
    own = _own_projections(algorithm)
    used = projections_in_use(own)
    span = events if at is None else at
    plan = [
        (name, p, None if eager else _deferred(name, p, used, span)) for name, p in registry.all_projections().items()
    ]
    plan.sort(key=lambda x: (x[0] != RUNMETA.name, x[0] not in own, x[2] is not None, x[0]))
    out = []
    for name, p, deferred in plan:
        if deferred is None:
            out.append(fold_one(name, p, reader, run_id, at=at))
        else:
            f = Folded(name=name, short=name.rsplit(".", 1)[-1])
            f.deferred = deferred
            out.append(f)
    return out


def _deferred(name: str, p: Projection, used: set[str], span: int) -> str | None:
    """Why ``fold_all`` lists the projection unfolded (not ``eager``), or None."""
    if name not in used:
        return "not folded: this run's algorithm does not use it"
    if not p.snapshots and span > EAGER_REPLAY_LIMIT:
        return f"not folded yet: this projection keeps no snapshots, so folding it replays {span:,} events"
    return None


def _own_projections(algorithm: str | None) -> set[str]:
    if algorithm and algorithms.known(algorithm):
        return {p.name for p in getattr(algorithms.get(algorithm), "projections", ())}
    return set()


def projections_in_use(own: set[str]) -> set[str]:
    """Names of the projections worth folding for a run whose algorithm declares
    ``own``: RUNMETA, the conversation, the algorithm's own, and the site's."""
    return {RUNMETA.key, CONVERSATION.key, *registry.site_names(), *own}


def runmeta(run_id: str, *, using: str = "default") -> Folded:
    """The engine's own view of the run now (``RUNMETA``)."""
    reader = hydrating(DjangoEventStore(using), site_blobs())
    return fold_one(RUNMETA.key, RUNMETA, reader, run_id)


def fold_one(name: str, projection: Projection, reader: EventReader, run_id: str, *, at: int | None = None) -> Folded:
    out = Folded(name=name, short=name.rsplit(".", 1)[-1])
    try:
        loaded = async_to_sync(projection.load_info)(reader, run_id, cache=default_cache if at is None else None, at=at)
    except BlobIntegrityError as exc:
        out.error = f"Blob integrity error: {exc}"
        return out
    except BlobError as exc:
        out.error = f"Blob error: {exc}"
        return out
    except Exception as exc:  # a site's fold may raise: show it, keep the page
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.raw = loaded.state
    out.seq, out.source, out.base_seq, out.folded = (loaded.seq, loaded.source, loaded.base_seq, loaded.folded)
    out.state = state_json(loaded.state)
    return out


def state_json(state: object) -> object:
    """A folded state as JSON-ready data, whatever its type."""
    try:
        return registry.state_json(state)
    except Exception:
        pass
    snapshot = getattr(state, "snapshot", None)  # e.g. CONVERSATION: threads of messages
    if callable(snapshot):
        try:
            return registry.state_json(snapshot())
        except Exception:
            pass
    return repr(state)


# -- blobs -------------------------------------------------------------------------------


@dataclass
class BlobView:
    """One blob ref of an event, and what reading it found."""

    seq: int
    index: int
    ref: BlobRef
    ok: bool | None = None  # None: not checked
    status: str = "not checked"
    data: bytes | None = None

    @property
    def preview(self) -> str | None:
        """Text or pretty JSON of the (verified) bytes, cut at PREVIEW_BYTES."""
        if self.data is None:
            return None
        media = self.ref.media_type.split(";")[0].strip().lower()
        raw = self.data[:PREVIEW_BYTES]
        if media == "application/json" or media.endswith("+json"):
            try:
                return json.dumps(json.loads(self.data), indent=2, ensure_ascii=False)[:PREVIEW_BYTES]
            except ValueError:
                pass
        if media.startswith("text/") or media == "application/json" or media.endswith("+json"):
            return raw.decode("utf-8", errors="replace")
        return None

    @property
    def truncated(self) -> bool:
        return self.data is not None and len(self.data) > PREVIEW_BYTES


def check(view: BlobView, blobs: BlobReader | None, *, keep: bool = False) -> BlobView:
    """Read and verify the blob; record the result (and the bytes when ``keep``)."""
    if blobs is None:
        view.ok, view.status = False, "no blob store is configured (AAA['BLOB_STORAGE'])"
        return view
    try:
        data = blobs.get(view.ref)
    except BlobIntegrityError as exc:
        view.ok, view.status = False, f"INTEGRITY ERROR: {exc}"
    except BlobNotFoundError as exc:
        view.ok, view.status = False, f"missing: {exc}"
    except BlobError as exc:
        view.ok, view.status = False, f"unreadable: {exc}"
    else:
        view.ok, view.status = True, "verified (sha256 and size match)"
        if keep:
            view.data = data
    return view


def refs_of(seq: int, blobs_json: Any) -> list[BlobView]:
    out = []
    for i, raw in enumerate(blobs_json or []):
        try:
            out.append(BlobView(seq=seq, index=i, ref=BlobRef.from_dict(raw)))
        except (TypeError, ValueError):
            continue  # a malformed ref cannot name a blob: nothing to show
    return out
