"""``Algorithm``: the base class of every agent algorithm.

An algorithm is a registered name, an input schema (``Input``), a JSON config
(``Config``) and a ``step(ctx, event)`` that decides from projections what to ask
for next. It keeps no state between steps: any process can rebuild it from the
``aaa.run.started`` event (``from_config``) and continue the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from aaa_django.data.jsonvalue import JSONObject
from aaa_django.events import Event
from aaa_django.runtime import Ctx
from aaa_django.runtime.registry import register


class NoConfig(BaseModel):
    """The config of an algorithm that has none."""

    model_config = ConfigDict(extra="forbid")


class Algorithm:
    """Subclass with ``name = "acme.summarise"``, ``Input``, ``Config`` and ``step``.

    A subclass that sets ``name`` is registered when it is defined. ``Input`` (a
    pydantic model, or None for "anything") is enforced by the ValidationHandler: a
    run whose input does not fit ends ``invalid_input``. The instance's settings live
    in ``self.cfg`` (a ``Config``), which is all that is saved in the started event.
    """

    name: ClassVar[str]
    Input: ClassVar[type[BaseModel] | None] = None
    Config: ClassVar[type[BaseModel]] = NoConfig
    #: the projections ``step`` decides from (the admin and API show these first)
    projections: ClassVar[tuple[Any, ...]] = ()
    #: event types whose arrival never changes what ``step`` decides (e.g. the
    #: algorithm's own requests: it waits for their results): the engine does not
    #: call ``step`` for them, a step less per such event. Limits, cancellation and
    #: the handlers still see them.
    ignores: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            register(cls)

    def __init__(self, **config: object) -> None:
        self.cfg = self.Config(**config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config()!r})"

    def config(self) -> JSONObject:
        """The JSON config saved in ``aaa.run.started``."""
        return self.cfg.model_dump(mode="json")

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> Algorithm:
        """Rebuild an instance from its JSON config (what another process does)."""
        obj = cls.__new__(cls)
        obj.cfg = cls.Config.model_validate(config)
        return obj

    async def step(self, ctx: Ctx, event: Event) -> None:
        """React to the run's state (``await ctx.project(...)``) after ``event``."""
        raise NotImplementedError
