"""Child runs: a run started by another run's step, and what each run's end means to
the other.

A step asks for a child with ``ctx.child(...)`` (``aaa.child.requested``); the
engine starts it (:meth:`Children.start`) as a run of its own whose
``aaa.run.started`` names its parent. When a run ends (:meth:`Children.after_end`)
its parent is told (``aaa.child.completed`` in the parent's log) and its children
still running are asked to end ``cancelled`` (:meth:`Children.cascade_cancel`: the
cancellation cascades down the tree). Every event has an id derived from the one it
answers, so a re-delivery, or a run adopted by another process
(:meth:`Engine.resume <aaa_django.runtime.Engine.resume>`), records each once.
"""

from __future__ import annotations

from aaa_django.events import Event

from . import offered
from .event_types import CANCEL_REQUESTED, CHILD_COMPLETED, RUN_COMPLETED, RUN_STARTED, started_id
from .facade import Facade
from .meta import RunMeta


class Children:
    """An engine's child runs, and the ends of its runs."""

    def __init__(self, engine: Facade) -> None:
        self.engine = engine

    async def after_end(self, event: Event, meta: RunMeta) -> None:
        """The engine's reaction to a run's ``aaa.run.completed`` (``event``): waiters
        woken, the parent told, the children still running cancelled."""
        run_id = event.stream
        self.engine.wake(run_id)
        out: list[Event] = []
        if meta.parent:
            out.append(
                event.derive(
                    CHILD_COMPLETED,
                    {
                        "child": run_id,
                        "key": meta.child_key,
                        "outcome": event.data.get("outcome"),
                        "value": event.data.get("value"),
                    },
                    stream=meta.parent,
                )
            )
        out.extend(self.cascade_cancel(event, child) for child in sorted(meta.children))
        if out:
            await self.engine.append(out)

    @staticmethod
    def cascade_cancel(completion: Event, child: str) -> Event:
        """The cancellation a run's end (``completion``) asks of its child ``child``."""
        return completion.derive(
            CANCEL_REQUESTED,
            {"reason": f"parent run ended {completion.data.get('outcome')}", "by": completion.stream},
            key=child,
            stream=child,
        )

    async def start(self, event: Event, meta: RunMeta) -> None:
        """Start the child an ``aaa.child.requested`` (``event``) asks for."""
        engine = self.engine
        d = event.data
        data = {
            "algorithm": d["algorithm"],
            "config": offered.resolve(engine, d["algorithm"], d.get("config") or {}),
            "input": d.get("input"),
            "budget": d.get("budget"),
            "deadline": d.get("deadline"),
            "parent": event.stream,
            "key": d.get("key"),
            "owner": meta.owner,
        }
        child = d["child"]
        await engine.append(
            [
                Event(
                    id=started_id(child),
                    stream=child,
                    type=RUN_STARTED,
                    data=data,
                    causation=event.id,
                    tenant=event.tenant,
                )
            ]
        )

    async def completion_event(self, run_id: str) -> Event | None:
        """The run's ``aaa.run.completed`` if it has ended (one this engine appended is
        kept; another process's is read), else None.

        A run's end is the last event of its log (nothing is appended after it:
        :func:`~aaa_django.events.store.check_open`), so the read is of the log's head
        and its last event, two small queries, and no fold of the log: a thousand
        waits woken by their runs' ends each pay that, not a load of the run's state
        (waiters look for other processes' ends: the head is the store's, never a
        copy held here)."""
        engine = self.engine
        known = engine._completions.get(run_id)
        if known is not None:  # appended here: a run's end is final
            return known
        store = engine.store
        head = await store.head(run_id)
        if head is None:
            return None
        events = await store.read(run_id, after=head[0] - 1, limit=1)
        return events[0] if events and events[0].type == RUN_COMPLETED else None
