"""Appends: how an engine writes to the log.

Every event an engine writes goes through :meth:`Appends.append`: grouped by run,
cut at the run's end (a step's output after it is not part of the run), a run's end
preceded by a result for each call it cuts off (:func:`~.limits.cut_off`), a
request followed by what the handler that takes it here records with it
(:class:`~.engine_api.RecordsWithRequest`: a model call's first attempt), big
payloads claim-checked into the blob store, appended to the store (a duplicate id is
absorbed; a closed stream refuses the batch, which is dropped), the due times stored
armed (:mod:`~aaa_django.runtime.timers`), the observers told, a run's end and a
wait for a person announced to the waiters, and the new events, only those,
published on the bus.

A handler's result goes through :meth:`Appends.answer`: where the bus lets the run's
step run here (:class:`~aaa_django.runtime.bus.StepsInline`), the step on the
result runs first, on the run's log as this engine holds it with the result staged
after it, and the result and the step's output go in one append guarded by the held
head (one commit instead of two; the same log, event for event). The result's
delivery then skips the step.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import groupby

from aaa_django.data.claims import claim_payload, put_claim
from aaa_django.events import ClosedStreamError, Event, EventList, InfrastructureError
from aaa_django.events.store import caller_alone
from aaa_django.events.tail import Staged

from . import bounded, limits
from .bus import StepsInline
from .engine_api import EngineAPI, RecordsWithRequest
from .event_types import MESSAGE_SENT, QUESTION_ASKED, RUN_COMPLETED
from .facade import Facade
from .meta import FOLDED, RunMeta
from .observe import notify_appended

log = logging.getLogger("aaa_django.runtime")


class Appends:
    """An engine's appends, and its answers (a result with its run's step on it).
    ``answers``: take the step on a result before its append where the bus allows."""

    def __init__(self, engine: Facade, *, answers: bool = True) -> None:
        self.engine = engine
        bus = engine.bus
        #: the bus, when a result may be stepped on before its append, with the step's
        #: output (``answer``; asked for, and the bus says where, ``StepsInline``)
        self.steps_inline: StepsInline | None = bus if answers and isinstance(bus, StepsInline) else None
        #: the run, and the output kept, of a step on a result not yet appended (``answer``)
        self.capture: contextvars.ContextVar[tuple[str, list[Event]] | None] = contextvars.ContextVar(
            f"aaa_capture_{id(engine):x}", default=None
        )

    async def append(self, events: Iterable[Event]) -> list[Event]:
        """Claim-check, append (per stream, in order) and publish; return the new events
        (:meth:`Engine.append <aaa_django.runtime.Engine.append>`).

        Events already in the store (same id) are absorbed and not published again.
        Nothing is appended after a run's ``aaa.run.completed``, nor to a run that was
        erased or never started: the store refuses it (``ClosedStreamError``), and the
        refused events are dropped here (a late result of an ended run). The bus is
        given them as an :class:`~aaa_django.events.EventList` that says whether they
        are all committed (not, when appended inside a caller's transaction: the
        Celery bus then enqueues them at its commit).
        """
        capture = self.capture.get()
        stored = EventList()
        for stream, group in groupby(events, key=lambda e: e.stream):
            batch = through_completion(group)
            if capture is not None:
                # A step on a result not yet appended (``answer``): its output joins the
                # result's append; an append anywhere else cannot wait for it.
                if stream != capture[0]:
                    raise NotInline(stream)
                capture[1].extend(batch)
                stored.extend(batch)
                continue
            try:
                added = await self.append_stream(stream, batch)
            except ClosedStreamError as exc:
                log.debug("not appended to %s: %s", stream, exc)
                continue
            if isinstance(added, EventList) and not added.committed:
                stored.committed = False
            stored.extend(added)
        if capture is None:
            await self.appended(stored)
        return stored

    async def append_at(self, events: Iterable[Event], head: int) -> list[Event]:
        """Append ``events`` (of one run) only if the run's log still ends at seq
        ``head`` (see :meth:`Engine.append_at <aaa_django.runtime.Engine.append_at>`)."""
        events = list(events)
        if not events:
            return []
        stream = events[0].stream
        if any(e.stream != stream for e in events):
            raise ValueError("append_at takes the events of one run")
        added = await self.append_stream(stream, through_completion(events), expected_seq=head)
        stored = added if isinstance(added, EventList) else EventList(added)
        await self.appended(stored)
        return stored

    async def append_stream(
        self,
        stream: str,
        batch: list[Event],
        *,
        expected_seq: int | None = None,
        folded: tuple[RunMeta, int] | None = None,
    ) -> list[Event]:
        """``batch`` (of ``stream``) claim-checked and appended; its due times kept, the
        observers told. A batch that ends the run records first what it cuts off
        (:func:`~.limits.cut_off`; ``folded``: the run's RUNMETA with the batch's first N
        events, when the caller has it); any other gets what handlers record with its
        requests (:meth:`with_requests`). Raises what the store raised."""
        engine = self.engine
        made: list[tuple[RecordsWithRequest, Event]] = []
        if batch and batch[-1].type == RUN_COMPLETED:
            # (in a step, the RUNMETA it decided from: no read)
            meta, done = folded if folded is not None else (await engine.meta(stream), 0)
            batch = limits.cut_off(batch, meta, done)
        elif engine.records_with:
            batch, made = await self.with_requests(batch)
        if engine.blobs is not None:
            batch = [await self.claim(e) for e in batch]
        engine._deliveries.appending(stream)
        alone = caller_alone.set(engine.turns.alone())  # (a hint to the store: see caller_alone)
        added: list[Event] = []
        try:
            added = await (
                engine.store.append(batch)
                if expected_seq is None
                else engine.store.append(batch, expected_seq=expected_seq)
            )
        finally:
            caller_alone.reset(alone)
            engine._deliveries.appending(stream)  # (a read meanwhile may have kept the log before it)
            if made:  # (also when the append failed: nothing of it was stored)
                await _not_recorded(made, added)
        if added and engine._timers.keeps:
            # As soon as a due time is stored, as the run index's ``due_at`` is
            # (in the append's transaction): never a moment when the log says a
            # timer is running and this engine holds none.
            engine._timers.track(added)
        if added and engine.observers:
            await notify_appended(engine.observers, added)
        return added

    async def with_requests(self, batch: list[Event]) -> tuple[list[Event], list[tuple[RecordsWithRequest, Event]]]:
        """``batch`` with what the handlers that record with a request
        (:class:`~.engine_api.RecordsWithRequest`: the model handler's first attempt)
        record, each right after its request: in the request's commit; and who made
        which record (told after the append of those it did not store)."""
        makers = self.engine.records_with
        if not any(e.type in makers for e in batch):
            return batch, []
        out: list[Event] = []
        made: list[tuple[RecordsWithRequest, Event]] = []
        for i, e in enumerate(batch):
            out.append(e)
            for maker in makers.get(e.type, ()):
                record = await maker.with_request(batch, i)
                if record is not None:
                    out.append(record)
                    made.append((maker, record))
        return out, made

    async def appended(self, stored: EventList) -> None:
        """After an append: a run's end kept and its waiters woken; the new events
        published."""
        engine = self.engine
        for e in stored:
            if e.type == RUN_COMPLETED:
                bounded.keep(engine._completions, e.stream, e, bounded.COMPLETIONS_KEPT)
                engine.wake(e.stream)
            elif e.type in (MESSAGE_SENT, QUESTION_ASKED):  # it may wait for a person now
                engine.wake(e.stream)
        if stored:
            await engine.bus.publish(stored)

    async def answer(self, events: Iterable[Event]) -> list[Event]:
        """Append a handler's result to its run (``events``: of one run, e.g. a model's
        ``aaa.llm.completed``; :meth:`Engine.answer <aaa_django.runtime.Engine.answer>`)
        and, in the same append, what the run's step on it
        writes: the step runs first, under the run's serialisation, on the run's log
        as this engine holds it with the result after it (``Tail.staging``: seen in
        this context only, as not committed), its output is kept instead of appended,
        and the result and the output go as one batch guarded by the held head. One
        append, one commit, instead of two; the log is the same, event for event. The
        result's delivery then skips the step (it was taken); its handlers run as
        ever. Returns the new events, as :meth:`append`.

        Only where the bus lets the step run here (:class:`~.bus.StepsInline`: the
        in-process bus; the Celery bus in a worker that takes the result's queue) and
        this engine holds the run's log; anything the step
        would write elsewhere (another run), an append that finds the log moved on
        or the run ended, or an output the store refuses: the result is appended
        alone, as :meth:`append` does, and stepped on when it is delivered."""
        engine = self.engine
        events = list(events)
        inline = self.steps_inline
        if (
            inline is None
            or engine._closed
            or not events
            or any(e.stream != events[0].stream for e in events)
            or not inline.steps_here(events[0])
        ):
            return await self.append(events)
        stream = events[0].stream
        async with engine.bus.serial(stream, synced=True):
            head = engine.tail.held(stream)
            stored = None if head is None else await self._answer(stream, head, events)
        return stored if stored is not None else await self.append(events)

    async def _answer(self, stream: str, head: int, events: list[Event]) -> EventList | None:
        """:meth:`answer` under the run's lock, its log held to ``head``: the new events,
        or None (nothing appended: append the result alone)."""
        engine = self.engine
        staged = [e.with_seq(head + i) for i, e in enumerate(events, 1)]
        out: list[Event] = []
        token = self.capture.set((stream, out))
        try:
            with engine.tail.delivery(), engine.delivering(stream), engine.tail.staging(stream, staged) as kept:
                engine._deliveries.appending(stream)  # a RUNMETA kept before lacks the result
                for e in staged:
                    with engine.observing(e):  # (its step, as if in its own delivery)
                        await engine.react(e)
                stepped = await engine.meta(stream)  # (the step's, with the results: kept, no read)
        except (NotInline, Exception) as exc:  # (the result's delivery steps again, and sees it)
            log.debug("run %s: the step on a result not taken before its append (%r)", stream, exc)
            return None
        finally:
            self.capture.reset(token)
            engine._deliveries.appending(stream)
        try:
            added = await self.append_stream(
                stream, through_completion([*events, *out]), expected_seq=head, folded=(stepped, len(events))
            )
        except InfrastructureError:
            raise  # as the result's own append would
        except Exception as exc:  # the log moved on, the run ended, an output the store refuses
            log.debug("run %s: a result and its step's output not appended together (%r)", stream, exc)
            return None
        stored = added if isinstance(added, EventList) else EventList(added)
        results = {e.id for e in events}
        for e in stored:
            if e.id in results:
                bounded.keep(engine._stepped, e.id, None, bounded.STEPPED_KEPT)
        if stored.committed:
            self._publish_folds(stream, kept)
        await self.appended(stored)  # (the new events' deliveries are on their way)
        if stored.committed:
            await self._save_snapshots(stream, kept)
        return stored

    def _holds(self, stream: str, seq: int, event_id: str) -> Event | None:
        """The event at ``seq`` of ``stream`` in this engine's tail, if it is ``event_id``."""
        e = self.engine.tail.cached(stream, seq)
        return e if e is not None and e.id == event_id else None

    def _publish_folds(self, stream: str, kept: Staged) -> None:
        """The states the step's reads folded over the staged result, published now that
        it is appended (each where the log holds, at its cursor, the event it was folded
        up to)."""
        for cache, key, entry in kept.folds:
            e = self._holds(stream, entry.cursor, entry.event_id)
            if e is not None and e.time == entry.event_time:
                cache.publish(key, entry)

    async def _save_snapshots(self, stream: str, kept: Staged) -> None:
        """The snapshots the step's reads would have saved, saved now (where the log
        holds the event each was taken at). A failed save costs a longer fold later,
        nothing else (as a projection's own)."""
        for snapshot in kept.snapshots:
            if self._holds(stream, snapshot.seq, snapshot.event_id) is not None:
                try:
                    await self.engine.store.save_snapshot(snapshot)
                except Exception:
                    log.warning("saving a snapshot of %s failed", stream, exc_info=True)

    async def claim(self, e: Event) -> Event:
        """``e`` with its payload claim-checked into the blob store when it is big."""
        engine = self.engine
        if engine.blobs is None or e.type == RUN_COMPLETED or not e.data:
            return e
        raw = claim_payload(e.data, engine.claim_threshold)
        if raw is None:
            return e  # small (the common case): nothing to write, no hop to the store's thread
        stub, ref = await engine._blob_call(
            put_claim,
            e.data,
            raw,
            store=engine.blobs,
            namespace=e.stream,
            hot_fields=(*engine.hot_fields, *FOLDED.get(e.type, ())),
            namespaced=engine._namespaced,
        )
        return replace(e, data=stub, blobs=(*e.blobs, ref))


class NotInline(BaseException):
    """A step on a result not yet appended (``Engine.answer``) would append to another
    run: it is taken when the result is delivered instead. (Not an ``Exception``: it
    passes the step's own error boundary.)"""


async def _not_recorded(made: list[tuple[RecordsWithRequest, Event]], added: Iterable[Event]) -> None:
    """Tell each handler that recorded with a request which of its records the append
    did not store (:meth:`~.engine_api.RecordsWithRequest.not_delivered_here`)."""
    stored = {e.id for e in added}
    makers: dict[int, tuple[RecordsWithRequest, list[Event]]] = {}
    for maker, record in made:
        if record.id not in stored:
            makers.setdefault(id(maker), (maker, []))[1].append(record)
    for maker, records in makers.values():
        await _tell(maker, records)


async def not_delivered_here(engine: EngineAPI, records: Sequence[Event]) -> None:
    """For a bus: ``records``, stored with their requests by handlers of ``engine``
    (:class:`~.engine_api.RecordsWithRequest`) because the bus said the requests would
    be delivered in this process (:class:`~.bus.DeliversHere`), are not: the bus sends
    the requests elsewhere after all (this process began shutting down, or was fenced
    off the run, between the step and the append). What the handlers hold for them
    (the model handler: the attempt's lease) goes now; the process that takes a
    request finds its maker gone."""
    if not records:
        return
    makers = {id(m): m for ms in engine.records_with.values() for m in ms}
    for maker in makers.values():
        await _tell(maker, records)


async def _tell(maker: RecordsWithRequest, records: Sequence[Event]) -> None:
    """``maker.not_delivered_here(records)``; its error is logged, never raised over the
    append's or the publication's own outcome."""
    try:
        await maker.not_delivered_here(records)
    except Exception:
        log.exception("%r failed letting go of what it held for %d records not delivered here", maker, len(records))


def through_completion(events: Iterable[Event]) -> list[Event]:
    """``events`` up to their run's completion: a step's output after it is not part of
    the run (and the store would refuse the whole batch)."""
    out = []
    for e in events:
        out.append(e)
        if e.type == RUN_COMPLETED:
            break
    return out
