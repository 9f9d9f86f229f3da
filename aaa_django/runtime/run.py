"""``Run``: a handle on one run (its stream) to wait for, inspect or cancel."""

from __future__ import annotations

from aaa_django.events import Event

from . import conversation as talk
from .engine_api import EngineAPI
from .meta import RunMeta
from .outcome import Outcome


class Run:
    """A run of an algorithm; ``run_id`` is also the name of its event stream."""

    def __init__(self, engine: EngineAPI, run_id: str) -> None:
        self.engine = engine
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"

    async def result(self, timeout: float | None = None) -> Outcome:
        """Wait for the run's ``aaa.run.completed`` and return its :class:`Outcome`.

        Raises ``TimeoutError`` after ``timeout`` seconds (the run goes on).
        """
        return await self.engine.wait(self.run_id, timeout=timeout)

    async def outcome(self) -> Outcome | None:
        """The outcome if the run has ended, else None (does not wait)."""
        return await self.engine.outcome(self.run_id)

    async def meta(self) -> RunMeta:
        """The engine's view of the run (status, spend, open children, approvals)."""
        return await self.engine.meta(self.run_id)

    async def events(self, *, hydrate: bool = False) -> list[Event]:
        """The run's events as stored (or hydrated)."""
        events = await self.engine.store.read(self.run_id)
        if hydrate:
            events = [await self.engine.hydrate(e) for e in events]
        return events

    async def waiting(self, timeout: float | None = None) -> RunMeta:
        """Wait until the run waits for a person (a conversation's next message, a
        question's answer) or has ended; its RUNMETA then (:mod:`.conversation`)."""
        return await talk.waiting(self.engine, self.run_id, timeout=timeout)

    async def say(self, content: str, *, by: str | None = None, key: str | None = None) -> Event:
        """Send the conversation waiting for it a person's next message."""
        return (await talk.say(self.engine, self.run_id, content, by=by, key=key)).message

    async def answer(self, question_id: str, value: object, *, by: str | None = None) -> Event:
        """Answer the run's open question ``question_id``."""
        return await talk.answer(self.engine, self.run_id, question_id, value, by=by)

    async def close(self, *, by: str | None = None) -> bool:
        """End a waiting conversation ``success``."""
        return await talk.close(self.engine, self.run_id, by=by)

    async def cancel(self, reason: str | None = None, *, by: str | None = None) -> bool:
        """Ask the engine to cancel the run (``cancelled`` unless it ended already)."""
        return await self.engine.cancel(self.run_id, reason=reason, by=by)
