"""``ValidationHandler``: a run's input, and its structured result, checked against
their schemas.

On ``aaa.run.started`` it validates ``input`` with the algorithm's ``Input`` model,
the tools its config names (a name no tool handler serves: :mod:`.offered`), and a
cost budget against the model clients' prices (a model without a price would make it
a budget that never trips), and appends ``aaa.input.validated`` (the algorithm
may start) or ``aaa.input.rejected`` with the errors (the engine ends the run
``invalid_input``).
On ``aaa.output.proposed`` it checks the proposed answer against the pydantic model the
proposal names (:mod:`aaa_django.runtime.output`) and appends ``aaa.output.validated``
or ``aaa.output.rejected`` (the algorithm sends the errors back to the model). A
request's verdicts share one result id, so it gets exactly one.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from aaa_django.events import Event

from . import registry
from .engine_api import EngineAPI
from .event_types import (
    INPUT_REJECTED,
    INPUT_VALIDATED,
    OUTPUT_PROPOSED,
    OUTPUT_REJECTED,
    OUTPUT_VALIDATED,
    RUN_STARTED,
    result_event,
    result_id,
)
from .meta import MAX_ERRORS
from .offered import tool_errors
from .output import check, output_model


class ValidationHandler:
    """Validates run inputs (attached by default by :class:`~aaa_django.runtime.Engine`)."""

    def __init__(self) -> None:
        self.engine: EngineAPI | None = None

    def attach(self, engine: EngineAPI) -> ValidationHandler:
        self.engine = engine
        engine.subscribe(RUN_STARTED, self)
        engine.subscribe(OUTPUT_PROPOSED, self)
        return self

    async def __call__(self, event: Event) -> None:
        engine = self.engine
        assert engine is not None, "attach the handler to an engine first"
        if event.type == OUTPUT_PROPOSED:
            await self._output(engine, event)
            return
        name = event.data.get("algorithm") or ""
        if not registry.known(name):
            return  # the engine ends the run `failed`: nothing to validate against
        rid = result_id(event.id)
        if await engine.find_after(event, [rid]):
            return
        errors = validate(registry.get(name), event.data.get("input"))
        errors += tool_errors(engine, name, event.data.get("config"), resolved=True)
        errors += start_errors(engine, event.data.get("config"), event.data.get("budget"))
        if errors:
            verdict = result_event(event, INPUT_REJECTED, {"errors": compact(errors)})
        else:
            verdict = result_event(event, INPUT_VALIDATED, {})
        await engine.answer([verdict])

    async def _output(self, engine: EngineAPI, event: Event) -> None:
        rid = result_id(event.id)
        if await engine.find_after(event, [rid]):
            return
        # The path comes from the run's config, validated where the algorithm was built.
        try:
            model = output_model(event.data["schema"], trusted=True)
        except (ImportError, ValueError) as exc:  # this process lacks the site's code: the run cannot end well
            error = {"type": "schema_unavailable", "loc": [], "msg": f"{type(exc).__name__}: {exc}"}
            await engine.answer([result_event(event, OUTPUT_REJECTED, {"errors": [error], "fatal": True})])
            return
        value, errors = check(model, event.data.get("value"))
        if errors:
            verdict = result_event(event, OUTPUT_REJECTED, {"errors": compact(errors)})
        else:
            verdict = result_event(event, OUTPUT_VALIDATED, {"value": value})
        await engine.answer([verdict])


def start_errors(engine: EngineAPI, config: object, budget: object) -> list[dict[str, Any]]:
    """Why the engine's start checks (:class:`~aaa_django.runtime.engine_api.ChecksStart`:
    the model handler's) refuse a run with ``config`` and ``budget``, in pydantic's
    error shape: asked when the run starts, and by the REST API before it starts one."""
    return [e for check in engine.start_checks for e in check.start_errors(config, budget)]


#: longest input an error quotes in the log (canonical JSON characters)
QUOTED = 200


def compact(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first ``MAX_ERRORS`` errors, each quoting at most :data:`QUOTED` characters
    of its input: small enough to stay in the rejection (``RUNMETA`` folds them, never
    from a blob), however big the input was."""
    out = []
    for err in errors[:MAX_ERRORS]:
        if "input" in err:
            quoted = json.dumps(err["input"], ensure_ascii=False, sort_keys=True)
            if len(quoted) > QUOTED:
                err = {**err, "input": quoted[:QUOTED] + "..."}
        out.append(err)
    return out


def validate(algorithm: object, data: object) -> list[dict[str, Any]]:
    """The validation errors of ``data`` against ``algorithm.Input`` (JSON-ready)."""
    schema = getattr(algorithm, "Input", None)
    if schema is None:
        return []
    try:
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            schema.model_validate(data)
        else:  # any pydantic-compatible type: TypeAdapter does the rest
            TypeAdapter(schema).validate_python(data)
    except ValidationError as exc:
        return json.loads(exc.json(include_url=False))
    return []
