"""Structured results: a run's answer checked against a pydantic model.

An algorithm that promises a structured result names a pydantic model in its config
(``output``: a dotted path, so any process finds it; ``output_schema``: its JSON
schema, saved in the run, offered to the model and shown in the admin). When the model
answers, the algorithm appends ``aaa.output.proposed`` ``{"value", "schema"}``; the
:class:`~aaa_django.validate.ValidationHandler` appends ``aaa.output.validated``
``{"value": <the validated value as JSON>}`` or ``aaa.output.rejected``
``{"errors": [...]}``, and the algorithm sends the errors back to the model
(:func:`describe`) or ends the run.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from . import dotted


def output_model(path: str, *, trusted: bool = False) -> type[BaseModel]:
    """The pydantic model at ``path``: one this process has loaded, or (``trusted``:
    a path a run's validated config wrote) imported. ``ValueError`` otherwise."""
    model = dotted.load(path) if trusted else dotted.loaded(path)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ValueError(f"{path!r} is not a pydantic model but {model!r}")
    return model


def check(model: type[BaseModel], value: object) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``(the value validated, as JSON; [])`` or ``(None, pydantic's errors)``. A string
    is read as JSON (a model that answers in text)."""
    try:
        fitted = model.model_validate_json(value) if isinstance(value, str) else model.model_validate(value)
    except ValidationError as exc:
        return None, json.loads(exc.json(include_url=False))
    return fitted.model_dump(mode="json"), []


def describe(errors: list[dict[str, Any]]) -> str:
    """The errors as lines a model can act on: ``- city: Field required``."""
    lines = []
    for e in errors:
        where = ".".join(str(part) for part in e.get("loc") or ()) or "(the answer)"
        lines.append(f"- {where}: {e.get('msg')}")
    return "\n".join(lines)
