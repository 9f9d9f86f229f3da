"""``LLMHandler``: turns each ``aaa.llm.requested`` into exactly one result event.

The request carries only delta messages; the handler rebuilds the whole conversation
from the log (:data:`~aaa_django.llm.conversation.CONVERSATION`), calls the client and
appends ``aaa.llm.completed`` (``response.message``, ``usage``, ``cost``, ``tag``,
``attempt``) or ``aaa.llm.failed`` (``reason``: the client's, e.g. ``rate_limit``, or
``error``, ``timeout``). Nothing is raised across the bus. A request that is answered
already, or whose run has ended or is over a limit, is not sent.

**Attempts.** Every attempt sent to the provider is on the log before it is sent:
``aaa.llm.attempted`` (``request_id``, ``attempt``, ``model``, and its
:mod:`estimate <aaa_django.llm.attempts>`), its id deterministic per request and number,
so two deliveries cannot both make one attempt (the one whose append is absorbed
sends nothing). Where this process takes the request (a bus without exclusive leases;
one with them that says the request is delivered here, holding the attempt's lease
from before the append) the first attempt is recorded in the request's own append
(:meth:`LLMHandler.with_request`: one durable commit a call, not two), and the
request's delivery makes it. A client's own retries are attempts too (the
:data:`~aaa_django.llm.retry.BEFORE_RETRY` hook records each before it goes). The
result names the attempt it answers.

**Abandoned attempts.** A delivery that finds the request's latest attempt without
an outcome decides from the database (the run's head read again, not this process's
view), and calls the attempt abandoned (``aaa.llm.abandoned``, counted at its
estimate) only when its maker is gone:

- in this process, no delivery is making it (the handler's own in-flight set);
- this process holds the run (:class:`~aaa_django.runtime.holding.HoldsRuns`,
  asked before every attempt and every retry: a process that stood down, or whose
  run another process adopted, makes no call for it; a bus that does not say holds
  every run it delivers);
- on a bus whose deliveries of one event may run in several processes at once
  (:class:`~aaa_django.runtime.bus.ExclusiveLeases`: the Celery bus), the whole call,
  from the attempt's record to its result's append, holds the request's exclusive
  lease: a second delivery waits for the first (a live maker renews it), and gets it
  only once the maker released it without a result or died (its lease lapsed). (A
  run's hold alone does not say it: a delivery in another process claims the run.)

The engine ends the run ``failed`` once one call has ``max_abandoned`` attempts
abandoned (a crash loop cannot spend without limit).

**A reply in hand is never asked for again.** When the append of its result fails
transiently (a full disk, a database restart), the append is tried again with the
reply (the ``Redelivery`` policy's waits); a reply whose append outlasts them is
kept, by its result id, and a later delivery of the request appends it instead of
calling the model.

Given a ``deltas`` sink and a client that streams (:class:`StreamingLLMClient`,
detected once here), the handler streams each call and publishes its text as
:class:`~aaa_django.llm.deltas.TokenDelta` s as they come; the log gets the same one
``aaa.llm.completed`` either way. A run that ends while its call is in flight in this
process has the call cancelled (the run's end recorded it, at its estimate).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import random
import traceback
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from aaa_django.data.jsonvalue import JSONObject, JSONValue
from aaa_django.events import Event, InvalidEventError, derive_id, encode_json
from aaa_django.runtime import Engine, bounded
from aaa_django.runtime.bus import DeliversHere, ExclusiveLeases
from aaa_django.runtime.event_types import (
    LLM_ABANDONED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    abandoned_id,
    attempt_id,
    result_event,
    result_id,
)
from aaa_django.runtime.holding import HoldsRuns, holder_id, process_gone
from aaa_django.runtime.meta import OpenCall
from aaa_django.runtime.retry import Redelivery, transient

from .attempts import ASSUMED_MAX_TOKENS, Estimator
from .client import LLMClient, PricedClient, StreamingLLMClient, TextSink
from .conversation import CONVERSATION, conversation_of
from .deltas import DeltaSink, TokenDelta
from .messages import LLMRequest, Message
from .retry import BEFORE_RETRY, StopAttempts

log = logging.getLogger("aaa_django.llm")

#: replies kept after their result's append failed for good, for a later delivery
REPLIES_KEPT = 1024
#: times a delivery decides again after another delivery made the attempt it was about
#: to make (then it leaves the request to that one)
CLAIM_TRIES = 3
#: seconds between looks at the log while waiting for another process's attempt (its
#: lease): is the request answered, or its maker's process ended?
MAKER_POLL = 0.5
#: seconds the lease of a first attempt recorded with its request (on a bus with
#: leases) waits for the request's delivery here to take it over; past them it is let
#: go, and whoever delivers the request decides from the log. (A fallback: an append
#: that does not store the attempt, and a bus that sends the request elsewhere after
#: all, let it go at once: ``not_delivered_here``.)
RESERVED_FOR = 30.0
#: seconds the lease of a first attempt to record with its request is waited for,
#: before the request's append (it is free unless another delivery of the same
#: request is under way: then the first attempt is not recorded with it)
RESERVE_WAIT = 1.0


class _Reserved:
    """The lease on a request's first attempt, taken before the request's append
    (:meth:`LLMHandler.with_request`, on a bus with leases), until the request's
    delivery here takes it over (:meth:`claim`) or :data:`RESERVED_FOR` passes."""

    __slots__ = ("request_id", "lease", "timer", "claimed")

    def __init__(self, request_id: str, lease: AbstractAsyncContextManager[None]) -> None:
        self.request_id = request_id
        self.lease = lease
        self.claimed = False
        self.timer: asyncio.TimerHandle | None = None

    def claim(self) -> AbstractAsyncContextManager[None] | None:
        """The lease, now the caller's to release; None if it was let go already."""
        if self.claimed:
            return None
        self.claimed = True
        if self.timer is not None:
            self.timer.cancel()
        return self.lease


async def _stop_taking(taking: asyncio.Future, lease: AbstractAsyncContextManager[None]) -> None:
    """Stop ``taking`` (a lease's ``__aenter__`` under way) and, if it took the lease
    as it was cancelled, let the lease go."""
    taking.cancel()
    await asyncio.wait({taking})
    if not taking.cancelled() and taking.exception() is None:
        await lease.__aexit__(None, None, None)


class _Call:
    """One call of the client for a request: the attempts it made (log numbers), and
    where the leases on them go (released once the result is appended). It is the
    client's retry hook for the call (:data:`~aaa_django.llm.retry.BEFORE_RETRY`):
    one object for the call's whole wait on the model, not a closure and its cells
    (docs/engine.md: what outlives the collector's young generations)."""

    __slots__ = ("handler", "request", "llm_request", "first", "last", "held")

    def __init__(
        self,
        handler: LLMHandler,
        request: Event,
        llm_request: LLMRequest,
        attempt: int,
        held: contextlib.AsyncExitStack,
    ) -> None:
        self.handler = handler
        self.request = request
        self.llm_request = llm_request
        self.first = self.last = attempt
        self.held = held

    async def __call__(self, n: int) -> None:
        """Before the client's attempt ``n`` (2, 3...) of this call: recorded first."""
        handler, event, held = self.handler, self.request, self.held
        attempt = self.first + n - 1
        if await handler._open(event, fresh=True) is None or not handler._holds(event.stream):
            raise StopAttempts(f"model request {event.id}: answered, ended or not held here")
        if handler._leases is not None:
            lease, _ = await handler._lease(event, attempt)
            if lease is None:
                raise StopAttempts(f"model request {event.id}: attempt {attempt} made elsewhere")
            held.push_async_exit(lease)
        if not await handler._engine().append([handler._attempted(event, self.llm_request, attempt)]):
            raise StopAttempts(f"model request {event.id}: attempt {attempt} made elsewhere")
        self.last = attempt


class LLMHandler:
    """Calls ``client`` for model requests; ``timeout`` (seconds) bounds each call;
    ``deltas`` receives the reply's text as it streams (when ``client`` streams);
    ``assumed_max_tokens``: the reply limit an attempt's estimate assumes when neither
    the request nor the client sets one (:mod:`~aaa_django.llm.attempts`);
    ``redelivery``: the waits between appends of a result that failed transiently;
    ``attempt_with_request``: record a request's first attempt in the request's append
    where this process takes the request (:meth:`with_request`)."""

    def __init__(
        self,
        client: LLMClient,
        *,
        timeout: float | None = None,
        deltas: DeltaSink | None = None,
        assumed_max_tokens: int = ASSUMED_MAX_TOKENS,
        redelivery: Redelivery | None = None,
        attempt_with_request: bool = True,
    ) -> None:
        self.client = client
        self.attempt_with_request = attempt_with_request
        self.timeout = timeout
        self.deltas = deltas
        self.redelivery = redelivery or Redelivery()
        #: the client, when it streams and someone listens
        self.streaming: StreamingLLMClient | None = (
            client if deltas is not None and isinstance(client, StreamingLLMClient) else None
        )
        #: the client when it can tell priced models from unpriced ones (detected once)
        self.pricer: PricedClient | None = client if isinstance(client, PricedClient) else None
        #: what an attempt costs at most (the client's prices and limits, detected once)
        self.estimator = Estimator(client, assumed_max_tokens=assumed_max_tokens)
        self.engine: Engine | None = None
        #: whether the bus says which runs this process holds, and its cluster-wide
        #: leases (detected once, in ``attach``)
        self._leases: ExclusiveLeases | None = None
        self._holder: HoldsRuns | None = None
        self._inflight: set[str] = set()
        #: this process, as its attempts name their maker (``by``)
        self.maker = holder_id("llm")
        #: result id -> a result whose append failed for good (the reply in hand)
        self._replies: OrderedDict[str, Event] = OrderedDict()
        #: run id -> request id -> the task calling the client
        self._running: dict[str, dict[str, asyncio.Task]] = {}
        #: requests whose first attempt this handler recorded with them
        #: (``with_request``), not yet taken by their delivery: True, or on a bus with
        #: leases the attempt's lease, held since before the request's append
        self._first: OrderedDict[str, bool | _Reserved] = OrderedDict()
        #: the bus, when it says where an event appended here will be delivered
        #: (detected once, in ``attach``)
        self._here: DeliversHere | None = None
        #: reserved leases being let go (their tasks, kept until done)
        self._letting_go: set[asyncio.Task] = set()

    def attach(self, engine: Engine) -> LLMHandler:
        """Subscribe to ``aaa.llm.requested`` (and run ends, to cancel calls in flight)
        on ``engine``."""
        self.engine = engine
        self._holder = engine.bus if isinstance(engine.bus, HoldsRuns) else None
        self._leases = engine.bus if isinstance(engine.bus, ExclusiveLeases) else None
        self._here = engine.bus if isinstance(engine.bus, DeliversHere) else None
        engine.subscribe(LLM_REQUESTED, self)
        engine.subscribe(RUN_COMPLETED, self.on_run_completed)
        return self

    async def with_request(self, batch: Sequence[Event], index: int) -> Event | None:
        """The first attempt of the request ``batch[index]``, to append in the request's
        commit (:class:`~aaa_django.runtime.engine_api.RecordsWithRequest`): one durable
        commit a model call instead of two. Only where this process takes the request
        and holds its run, and unless ``attempt_with_request=False``: a bus without
        exclusive leases delivers every event of a run where it was appended; one with
        them (the Celery bus) must say that this process will
        (:class:`~aaa_django.runtime.bus.DeliversHere`: a worker that takes the
        request's queue), and the attempt's lease is taken first, before the append, and
        held until the request's delivery here has the result appended (a second
        delivery of the request, elsewhere, waits for it as for any live maker). The
        request's delivery then calls the model for that attempt. Should this process
        end in between, the attempt is abandoned as any other whose maker is gone
        (counted at its estimate, which is computed here, from the conversation the log
        has up to the request)."""
        event = batch[index]
        if not self.attempt_with_request or not self._holds(event.stream):
            return None
        if self._leases is not None and (self._here is None or not self._here.delivers_here(event)):
            return None
        if any(e.causation == event.id for e in batch[index + 1 :]):
            return None  # a copy with its attempts and result (a fork): nothing to make
        if event.id in self._first:
            # Recorded with an earlier append of the request here, stored (one that was
            # not is let go: ``not_delivered_here``), its delivery still to come: this append
            # of the request again (a second delivery's step) is absorbed, as it would be.
            return None
        first: bool | _Reserved = True
        if self._leases is not None:
            reserved = await self._reserve(event)
            if reserved is None:
                return None
            first = reserved
        engine = self._engine()
        state = copy.deepcopy(await engine.project(CONVERSATION, event.stream))
        for e in batch[: index + 1]:  # (the same append's events up to the request)
            state = CONVERSATION.apply(state, e)
        attempted = self._attempted(event, self._request_of(event, state.request(event.id) or []), 1)
        bounded.keep(self._first, event.id, first, bounded.RUNS_KEPT)
        return attempted

    async def not_delivered_here(self, records: Sequence[Event]) -> None:
        """First attempts :meth:`with_request` made whose requests this process will
        not deliver (:class:`~aaa_django.runtime.engine_api.RecordsWithRequest`): their
        append did not store them, or the bus sent the requests elsewhere after all.
        Their leases go now, not after :data:`RESERVED_FOR`: a delivery of the request
        elsewhere may be waiting for the lease (to record the attempt itself, or to
        find its maker gone and record it abandoned)."""
        for record in records:
            request_id = record.causation or ""
            first = self._first.get(request_id)
            if first is None:
                continue
            del self._first[request_id]
            lease = first.claim() if isinstance(first, _Reserved) else None
            if lease is not None:
                await lease.__aexit__(None, None, None)

    async def _reserve(self, event: Event) -> _Reserved | None:
        """The lease on the first attempt of the request ``event`` (not appended yet),
        taken within :data:`RESERVE_WAIT`, and let go after :data:`RESERVED_FOR` unless
        the request's delivery here claims it first; None if it could not be taken (a
        delivery of the same request elsewhere holds it, or the leases' store failed:
        the request is then handled as ever when it is delivered)."""
        assert self._leases is not None
        lease = self._leases.exclusive(attempt_id(event.id, 1))
        taking = asyncio.ensure_future(lease.__aenter__())
        done, _ = await asyncio.wait({taking}, timeout=RESERVE_WAIT)
        if not done:
            await _stop_taking(taking, lease)
            return None
        failure = taking.exception()
        if failure is not None:
            log.warning(
                "model request %s of run %s: its first attempt's lease could not be taken (%s: %s); it is recorded "
                "when the request is delivered",
                event.id,
                event.stream,
                type(failure).__name__,
                failure,
            )
            return None
        reserved = _Reserved(event.id, lease)
        reserved.timer = asyncio.get_running_loop().call_later(RESERVED_FOR, self._let_go, reserved)
        return reserved

    def _let_go(self, reserved: _Reserved) -> None:
        """:data:`RESERVED_FOR` has passed and no delivery here claimed the lease."""
        lease = reserved.claim()
        if lease is None:
            return
        if self._first.get(reserved.request_id) is reserved:
            del self._first[reserved.request_id]
        task = asyncio.ensure_future(lease.__aexit__(None, None, None))
        self._letting_go.add(task)
        task.add_done_callback(self._let_go_done)

    def _let_go_done(self, task: asyncio.Task) -> None:
        self._letting_go.discard(task)
        if not task.cancelled() and task.exception() is not None:  # (an unreleased lease expires anyway)
            log.warning("letting go of a model attempt's lease failed: %s", task.exception())

    async def __call__(self, event: Event) -> None:
        if event.id in self._inflight:  # delivered again while we are on it
            return
        self._inflight.add(event.id)
        try:
            await self._handle(event)
        finally:
            self._inflight.discard(event.id)

    async def on_run_completed(self, completion: Event) -> None:
        """The run ended: cancel its calls in flight here (its end recorded them)."""
        for task in list(self._running.get(completion.stream, {}).values()):
            task.cancel()

    # -- deciding -------------------------------------------------------------------------

    async def _handle(self, event: Event) -> None:
        first = self._first.pop(event.id, None)
        # (on a bus with leases, the first attempt's lease, held since before the
        # request's append: this delivery's to release from here on)
        reserved = first.claim() if isinstance(first, _Reserved) else None
        async with contextlib.AsyncExitStack() as held:
            if reserved is not None:
                held.push_async_exit(reserved)
            await self._decide(event, first is not None, held)

    async def _decide(self, event: Event, first: bool, reserved: contextlib.AsyncExitStack) -> None:
        """Make the request's call, or not (see :meth:`_handle`); ``first``: its first
        attempt was recorded with it here (``with_request``), and ``reserved`` holds
        that attempt's lease if the bus has leases."""
        engine = self._engine()
        kept = self._replies.get(result_id(event.id))
        if kept is not None:  # a reply in hand: append it, never ask again
            await self._record(event, kept)
            return
        fresh = False
        lost = 0  # decisions another delivery made first
        while lost < CLAIM_TRIES:
            call = await self._open(event, fresh=fresh)
            if call is None:
                return
            if first and self._recorded_first(call):
                # Its first attempt, recorded with it here (``with_request``): make it.
                if not self._holds(event.stream):
                    log.info("run %s is no longer held here: model request %s not sent", event.stream, event.id)
                    return
                async with contextlib.AsyncExitStack() as held:
                    held.push_async_exit(reserved.pop_all())  # (the lease goes when the result is appended)
                    await self._call(_Call(self, event, await self._request(event), 1, held))
                return
            if first:
                first = False
                await reserved.aclose()  # not the attempt this process recorded: let go
            if call.attempts and not fresh:
                fresh = True  # asked before: decide from the database, not this view
                continue
            if not self._holds(event.stream):
                log.info("run %s is no longer held here: model request %s not sent", event.stream, event.id)
                return
            if call.in_flight is not None:
                # Its latest attempt has no outcome, and no delivery of this process makes
                # it: abandoned once its maker is gone (elsewhere: it let go of the
                # attempt's lease, or its process has ended).
                if not await self._maker_gone(event, call):
                    fresh = True
                    lost += 1
                    continue
                if not await engine.append([self._abandoned(event, call)]):
                    lost += 1
                fresh = True
                continue  # (the engine may end the run now: decided again)
            attempt = call.attempts + 1
            async with contextlib.AsyncExitStack() as held:
                if self._leases is not None:
                    lease, waited = await self._lease(event, attempt)
                    if lease is None:  # another delivery made that attempt: decided again
                        fresh = True
                        lost += 1
                        continue
                    held.push_async_exit(lease)
                    # What happened while it waited (taken at once: another delivery's
                    # attempt, made meanwhile, has the id this one's would have).
                    now = await self._open(event, fresh=True) if waited else call
                    if now is None or now.attempts >= attempt:
                        fresh = True
                        continue
                request = await self._request(event)
                if await engine.append([self._attempted(event, request, attempt)]):
                    await self._call(_Call(self, event, request, attempt, held))
                    return
            fresh = True  # another delivery made that attempt: it calls
            lost += 1
        log.warning(
            "model request %s of run %s: another delivery keeps deciding first; left to it", event.id, event.stream
        )

    def _recorded_first(self, call: OpenCall) -> bool:
        """Is ``call``'s only attempt the one this process recorded with its request, in
        flight (none of its deliveries made it yet)?"""
        return call.attempts == 1 and call.in_flight is not None and call.maker == self.maker

    async def _maker_gone(self, event: Event, call: OpenCall) -> bool:
        """Is the maker of the request's attempt in flight (``call.attempts``) gone? On a
        bus without leases (one process) yes: no delivery here makes it. Else when it
        was this process's (a delivery that ended), or its process has ended (a process
        of this machine), or it let go of the attempt's lease (waited for: a live maker
        holds it until its result is appended, and renews it)."""
        if self._leases is None or call.maker == self.maker or self._gone(call.maker):
            return True
        lease, _ = await self._lease(event, call.attempts)
        if lease is None:
            return False  # answered, ended, or found gone meanwhile: decided again
        await lease.__aexit__(None, None, None)
        now = await self._open(event, fresh=True)
        return now is not None and now.attempts == call.attempts and now.in_flight is not None

    def _gone(self, maker: str | None) -> bool:
        return maker is not None and maker != self.maker and process_gone(maker)

    async def _lease(self, event: Event, attempt: int) -> tuple[AbstractAsyncContextManager[None] | None, bool]:
        """The lease on attempt ``attempt`` of the request, taken (the caller releases
        it), and whether it was waited for (a live process held it). None, without it,
        as soon as the log shows the request answered, its run over, or that attempt
        made by a process known gone."""
        assert self._leases is not None
        lease = self._leases.exclusive(attempt_id(event.id, attempt))
        taking = asyncio.ensure_future(lease.__aenter__())
        waited = False
        try:
            async with self._engine().waiting():  # perhaps on another process's call
                while True:
                    done, _ = await asyncio.wait({taking}, timeout=MAKER_POLL)
                    if done:
                        taking.result()
                        return lease, waited
                    waited = True
                    call = await self._open(event, fresh=True)
                    if call is None or (
                        call.attempts == attempt and call.in_flight is not None and self._gone(call.maker)
                    ):
                        break
        finally:
            if not taking.done():
                await _stop_taking(taking, lease)
        return None, waited

    async def _open(self, event: Event, *, fresh: bool) -> OpenCall | None:
        """The request as the run's log has it, when it is still to be answered (the run
        not ended, no limit over); None else. ``fresh``: the run's head read from the
        database first."""
        engine = self._engine()
        if fresh:
            engine.tail.stale(event.stream)
        meta = await engine.meta(event.stream, fresh=fresh)
        if meta.completed or engine.limit_breach(meta) is not None:
            return None
        return meta.calls.get(event.id)

    async def _request(self, event: Event) -> LLMRequest:
        return self._request_of(event, await conversation_of(self._engine(), event))

    def _request_of(self, event: Event, messages: list[Message]) -> LLMRequest:
        d = event.data
        return LLMRequest(
            messages=messages,
            tools=list(d.get("tools") or ()),
            model=d.get("model"),
            tag=d.get("tag"),
            params=dict(d.get("params") or {}),
            output=d.get("output"),
            request_id=event.id,
            run_id=event.stream,
            agent=d.get("agent"),
        )

    def _attempted(self, event: Event, request: LLMRequest, attempt: int) -> Event:
        data = {
            "request_id": event.id,
            "attempt": attempt,
            "model": self.estimator.model(request),
            "estimate": self.estimator.estimate(request),
            "by": self.maker,
        }
        return Event(
            id=attempt_id(event.id, attempt),
            stream=event.stream,
            type=LLM_ATTEMPTED,
            data=data,
            causation=event.id,
            tenant=event.tenant,
        )

    def _abandoned(self, event: Event, call: OpenCall) -> Event:
        assert call.in_flight is not None
        data = {
            "request_id": event.id,
            "attempt": call.attempts,
            **call.in_flight.data(),
            "estimated": True,
            "maker": call.maker,
            "error": "the process making the attempt died or lost the run with it in flight; counted at its estimate",
        }
        return Event(
            id=abandoned_id(event.id, call.attempts),
            stream=event.stream,
            type=LLM_ABANDONED,
            data=data,
            causation=attempt_id(event.id, call.attempts),
            tenant=event.tenant,
        )

    # -- calling --------------------------------------------------------------------------

    async def _call(self, call: _Call) -> None:
        """Call the client for the attempt just recorded; append the result."""
        engine = self._engine()
        event, request = call.request, call.llm_request
        base = {"request_id": event.id, "tag": event.data.get("tag"), "thread": event.data.get("thread") or "main"}
        token = BEFORE_RETRY.set(call)
        try:
            client_call = (
                self.client.complete(request)
                if self.streaming is None
                else self.streaming.stream(request, self._publisher(event))
            )
            task = asyncio.ensure_future(asyncio.wait_for(client_call, self.timeout) if self.timeout else client_call)
        finally:
            BEFORE_RETRY.reset(token)
        running = self._running.setdefault(event.stream, {})
        running[event.id] = task
        try:
            async with engine.waiting():  # other runs' work goes on meanwhile
                await asyncio.wait({task})
        except asyncio.CancelledError:  # the delivery itself (shutdown): the attempt is left in flight
            task.cancel()
            raise
        finally:
            running.pop(event.id, None)
            if not running:
                self._running.pop(event.stream, None)
        if task.cancelled():
            return  # the run ended meanwhile: its end recorded the call
        exc = task.exception()
        if isinstance(exc, StopAttempts):
            log.info("%s", exc)
            return
        if exc is not None:
            data = {**base, "attempt": call.last, **self.failure(exc)}
            await self._record(event, result_event(event, LLM_FAILED, data))
            return
        response = task.result()
        message = _with_call_ids(response.message, event.id)
        data = {
            **base,
            "attempt": call.last,
            "response": {
                "message": message.to_dict(),
                "finish_reason": response.finish_reason,
            },
            "usage": response.usage.model_dump(),
            "cost": response.cost,
            "model": response.model,
        }
        if not response.priced:
            data["priced"] = False  # cost 0 because nobody priced the model, not free
        attempts = _records(getattr(response, "attempts", None))
        if attempts is not None and len(attempts) > 1:
            data["attempts"] = attempts  # (retried: how each attempt before went)
        await self._record(event, result_event(event, LLM_COMPLETED, data))

    async def _record(self, event: Event, result: Event) -> None:
        """Append ``result`` (with the run's step on it, ``Engine.answer``); an append
        that fails transiently is made again with it, never by asking the model again.
        One that fails for good raises (the bus delivers the request again, and this
        handler appends the reply it kept then)."""
        engine = self._engine()
        self._replies[result.id] = result
        self._replies.move_to_end(result.id)
        while len(self._replies) > REPLIES_KEPT:
            self._replies.popitem(last=False)
        retry = 0
        while True:
            try:
                stored = await engine.answer([result])
                break
            except Exception as exc:
                retry += 1
                delay = self.redelivery.delay(retry, random.random()) if transient(exc) else None
                if delay is None:
                    raise
                log.warning(
                    "appending the result of model request %s of run %s failed (%s: %s); the reply "
                    "is kept: appended again in %.2f s (retry %d)",
                    event.id,
                    event.stream,
                    type(exc).__name__,
                    exc,
                    delay,
                    retry,
                )
                async with engine.waiting():
                    await asyncio.sleep(delay)
        self._replies.pop(result.id, None)
        if retry and not stored:
            # Absorbed: an earlier try was committed without our hearing of it (its
            # connection lost after the commit), so nothing delivered it: deliver it now.
            engine.tail.stale(event.stream)
            found = await engine.find_after(event, [result.id])
            if result.id in found:
                await engine.bus.publish([found[result.id]])

    def _publisher(self, event: Event) -> TextSink:
        sink, run_id, request_id = self.deltas, event.stream, event.id
        assert sink is not None

        def on_text(index: int, text: str) -> None:
            sink.publish(TokenDelta(run_id=run_id, request_id=request_id, index=index, text=text))

        return on_text

    def _holds(self, run_id: str) -> bool:
        """May this process call out for ``run_id`` now (a bus that does not say: yes)?"""
        return self._holder is None or self._holder.holds(run_id)

    def _engine(self) -> Engine:
        assert self.engine is not None, "attach the handler to an engine first"
        return self.engine

    def unpriced(self, model: str | None) -> str | None:
        """The name of ``model`` (None: the client's default) when this handler's
        client knows it has no price; None when it has one or the client cannot tell."""
        if self.pricer is None or self.pricer.prices(model):
            return None
        return model or self.pricer.model or "the client's default model"

    def start_errors(self, config: object, budget: object) -> list[JSONObject]:
        """A run's start checked (``runtime.engine_api.ChecksStart``): a cost budget
        over a model (the run's ``config.model``, else the client's default) without a
        price could never trip (every call would cost 0)."""
        if not isinstance(budget, dict) or budget.get("cost") is None:
            return []
        model = config.get("model") if isinstance(config, dict) else None
        name = self.unpriced(model if isinstance(model, str) else None)
        if name is None:
            return []
        return [
            {
                "loc": ["budget", "cost"],
                "type": "unpriced_model",
                "msg": f"model {name!r} has no price, so a cost budget cannot be enforced: add it "
                "to the model client's pricing table (AAA['LLM']['PRICING'])",
            }
        ]

    def failure(self, exc: BaseException) -> JSONObject:
        """The data of ``aaa.llm.failed`` for ``exc``: ``reason`` (a client error's own
        ``reason``, e.g. ``rate_limit``; else ``timeout`` or ``error``), ``error``, and
        the client's ``status`` / ``attempts`` when it gives them."""
        if isinstance(exc, asyncio.TimeoutError):
            why = f"model call timed out after {self.timeout}s" if self.timeout else f"TimeoutError: {exc}"
            return {"reason": "timeout", "error": why}
        reason = getattr(exc, "reason", None)
        data: JSONObject = {
            "reason": reason if isinstance(reason, str) and reason else "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        }
        status = getattr(exc, "status", None)
        if isinstance(status, int):
            data["status"] = status
        attempts = _records(getattr(exc, "attempts", None))
        if attempts is not None:
            data["attempts"] = attempts
        return data


def _records(attempts: object) -> list[JSONValue] | None:
    """A client's attempt records as JSON (each as a string if it is not)."""
    if not isinstance(attempts, list):
        return None
    try:
        encode_json(attempts)
        return attempts
    except InvalidEventError:
        return [str(a) for a in attempts]


def _with_call_ids(message: Message, request_id: str) -> Message:
    """Give every tool call an id; missing ones are derived from the request id."""
    if not message.tool_calls or all(c.id for c in message.tool_calls):
        return message
    calls = tuple(
        c if c.id else c.model_copy(update={"id": "call_" + derive_id(request_id, "call", i)[:13]})
        for i, c in enumerate(message.tool_calls)
    )
    return message.model_copy(update={"tool_calls": calls})
