"""Django form fields from a pydantic model: the admin's start form, key by key.

:class:`Section` turns each key of a model (an algorithm's ``Input`` or ``Config``,
the run's ``Budget``) into one Django form field, named ``<prefix>__<key>``:

=============================================  =============================================
The key's type                                 The form field
=============================================  =============================================
``str``                                        ``CharField`` (min/max length; a text area
                                               for task, system and prompt keys)
``int`` / ``float``                            ``IntegerField`` / ``FloatField`` (min/max
                                               from ``ge``, ``gt``, ``le``, ``lt``)
``bool``                                       ``BooleanField`` (a yes/no/unset select when
                                               it may be null)
``Literal[...]`` / an ``Enum``                 ``TypedChoiceField`` of its values
``list[str]``                                  a text area, one item per line
anything else (a dict, a list of objects...)  ``JSONField`` for that one key
=============================================  =============================================

Each field's initial value is the key's default; its help text is the key's
description (pydantic's, else the ``#:`` comment above the key in its class), its
bounds and default. An empty field means the key's default, or null where the key may
be null. :meth:`Section.collect` turns the cleaned fields back into the dict the model
validates, and :meth:`Section.field_for` names the form field a pydantic error's
``loc`` points to, so an error shows beside its field.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Union, get_args, get_origin

from django import forms
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

#: the keys shown as a text area (a prompt, a task): by name
LONG_TEXT = re.compile(r"(^|_)(task|system|prompt|instructions?)($|_)")

#: what a key becomes (``Key.kind``)
TEXT, INT, FLOAT, BOOL, CHOICE, LINES, JSON = "text", "int", "float", "bool", "choice", "lines", "json"


@dataclass(frozen=True)
class Key:
    """One key of the model and the form field that edits it."""

    name: str
    field: str  # the form field's name: "<prefix>__<name>"
    kind: str
    nullable: bool
    required: bool  # the model needs a value (no default)


class Section:
    """The form fields of one pydantic model's keys (see the module).

    ``skip``: keys the caller renders itself (the start form's tool checkboxes).
    """

    def __init__(self, model: type[BaseModel], prefix: str, *, skip: tuple[str, ...] = ()) -> None:
        self.model = model
        self.prefix = prefix
        self.keys: list[Key] = []
        self.fields: dict[str, forms.Field] = {}
        notes = _comments(model)
        for name, info in model.model_fields.items():
            if name in skip:
                continue
            key, field = form_field(name, f"{prefix}__{name}", info, notes.get(name, ""))
            self.keys.append(key)
            self.fields[key.field] = field

    def loosen(self) -> None:
        """Require nothing (another source gives the value: the raw JSON)."""
        for field in self.fields.values():
            field.required = False

    def collect(self, cleaned: Mapping[str, object]) -> dict[str, Any]:
        """The model's data from the cleaned fields: an empty field is left out (the
        key's default) or null (where the key may be null)."""
        data: dict[str, Any] = {}
        for key in self.keys:
            if key.field not in cleaned:
                continue  # its own error is shown
            value = cleaned[key.field]
            if key.kind == BOOL and value is not None:
                data[key.name] = bool(value)
            elif _empty(value):
                if key.nullable:
                    data[key.name] = None
            else:
                data[key.name] = value
        return data

    def field_for(self, loc: Sequence[object]) -> str | None:
        """The form field an error at ``loc`` (pydantic's, within this model) belongs to."""
        if not loc:
            return None
        field = f"{self.prefix}__{loc[0]}"
        return field if field in self.fields else None


def form_field(name: str, field_name: str, info: FieldInfo, note: str = "") -> tuple[Key, forms.Field]:
    """The form field of one key (see the module's table)."""
    annotation, nullable = _unwrap(info.annotation)
    required = info.is_required()
    default = _default(info)
    bounds = _bounds(info)
    help_parts = [sentence(info.description or note)]
    kind, field = _field(name, annotation, nullable, required, bounds)
    help_parts.append(_bounds_text(bounds, kind))
    if default is not None and default != "" and default != [] and default != {}:
        help_parts.append(f"Default: {_show(default)}.")
    if nullable:
        help_parts.append("Empty: none.")
    field.help_text = " ".join(p.strip() for p in help_parts if p and p.strip())
    field.label = name
    if default is not None:
        field.initial = _initial(kind, default)
    return Key(name=name, field=field_name, kind=kind, nullable=nullable, required=required), field


def _field(
    name: str, annotation: Any, nullable: bool, required: bool, bounds: dict[str, Any]
) -> tuple[str, forms.Field]:
    """The kind of a key and its bare form field (labels and help added by the caller)."""
    needed = required and not nullable
    choices = _choices(annotation)
    if choices is not None:
        values = dict(choices)
        blank = [("", "—")] if nullable else []  # "none"; a default is preselected
        return CHOICE, forms.TypedChoiceField(
            choices=blank + [(str(v), label) for v, label in choices],
            coerce=lambda raw: _match(raw, values),
            required=needed,
            empty_value=None,
        )
    if annotation is bool:
        if nullable:
            return BOOL, forms.NullBooleanField(required=False)
        return BOOL, forms.BooleanField(required=False)
    if annotation is int:
        return INT, forms.IntegerField(required=needed, min_value=_int_min(bounds), max_value=_int_max(bounds))
    if annotation is float:
        return FLOAT, forms.FloatField(required=needed, min_value=bounds.get("ge"), max_value=bounds.get("le"))
    if annotation is str:
        long = bool(LONG_TEXT.search(name))
        widget: forms.Widget = (
            forms.Textarea(attrs={"rows": 3, "cols": 80, "class": "vLargeTextField"})
            if long
            else forms.TextInput(attrs={"class": "vTextField"})
        )
        return TEXT, forms.CharField(
            required=needed, widget=widget, min_length=bounds.get("min_length"), max_length=bounds.get("max_length")
        )
    if get_origin(annotation) is list and get_args(annotation) and get_args(annotation)[0] is str:
        return LINES, LinesField(required=needed)
    return JSON, JsonField(
        required=needed,
        widget=forms.Textarea(
            attrs={"rows": 3, "cols": 80, "class": "vLargeTextField aaa-json", "spellcheck": "false"}
        ),
    )


class JsonField(forms.JSONField):
    """One key's JSON; empty when there is no value (not ``null``)."""

    def prepare_value(self, value: object) -> object:
        return "" if value is None else super().prepare_value(value)


class LinesField(forms.CharField):
    """A list of strings, one a line (blank lines dropped)."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60, "class": "vLargeTextField"})

    def prepare_value(self, value: object) -> object:
        if isinstance(value, (list, tuple)):
            return "\n".join(str(v) for v in value)
        return value

    def to_python(self, value: object) -> list[str]:
        text = super().to_python(value)
        return [line.strip() for line in text.splitlines() if line.strip()]


# -- reading the model --------------------------------------------------------------------


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The annotation without ``None`` (``X | None`` -> X), and whether None was in it."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], len(rest) < len(args)
    return annotation, False


def _choices(annotation: Any) -> list[tuple[Any, str]] | None:
    """The values of a ``Literal`` of plain values or of an ``Enum``, with labels."""
    if get_origin(annotation) is Literal:
        values = get_args(annotation)
        if all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
            return [(v, str(v)) for v in values]
        return None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [(m.value, m.name) for m in annotation]
    return None


def _match(raw: object, values: Mapping[object, str]) -> object:
    """The choice whose text is ``raw`` (a posted value is always text)."""
    return next((v for v in values if str(v) == raw), raw)


def _default(info: FieldInfo) -> object:
    if info.default is not PydanticUndefined:
        return info.default
    if info.default_factory is not None:
        try:
            return info.default_factory()  # type: ignore[call-arg]
        except TypeError:  # a factory that takes the validated data: no default to show
            return None
    return None


def _bounds(info: FieldInfo) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in info.metadata:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            value = getattr(m, attr, None)
            if value is not None:
                out[attr] = value
    return out


def _int_min(bounds: dict[str, Any]) -> int | None:
    if "ge" in bounds:
        return int(bounds["ge"])
    return int(bounds["gt"]) + 1 if "gt" in bounds else None


def _int_max(bounds: dict[str, Any]) -> int | None:
    if "le" in bounds:
        return int(bounds["le"])
    return int(bounds["lt"]) - 1 if "lt" in bounds else None


def _bounds_text(bounds: dict[str, Any], kind: str) -> str:
    said = []
    for attr, words in (("ge", "at least"), ("gt", "more than"), ("le", "at most"), ("lt", "less than")):
        if attr in bounds:
            said.append(f"{words} {bounds[attr]}")
    if kind in (TEXT, LINES, JSON):
        if "min_length" in bounds:
            said.append(f"at least {bounds['min_length']} {'character' if kind == TEXT else 'item'}(s)")
        if "max_length" in bounds:
            said.append(f"at most {bounds['max_length']} {'character' if kind == TEXT else 'item'}(s)")
    return (", ".join(said).capitalize() + ".") if said else ""


def _initial(kind: str, default: object) -> object:
    if isinstance(default, enum.Enum):
        return str(default.value)
    if kind == CHOICE:
        return str(default)
    return default


def _show(value: object) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        short = value if len(value) <= 60 else value[:57] + "…"
        return json.dumps(short, ensure_ascii=False)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def sentence(text: str) -> str:
    """A description as help text: reST's ````literal```` marks dropped, a capital
    first letter, a full stop."""
    text = re.sub(r"``(.*?)``", r"\1", " ".join(text.split()))
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _empty(value: object) -> bool:
    return value is None or value == "" or value == [] or value == {}


@lru_cache(maxsize=256)
def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The ``#:`` comments above each key in the class body of ``model`` and its bases
    (the built-in configs document their keys that way)."""
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            lines = inspect.getsource(cls).splitlines()
        except (OSError, TypeError):
            continue
        said: list[str] = []
        for line in lines[1:]:
            stripped = line.strip()
            if stripped.startswith("#:"):
                said.append(stripped[2:].strip())
                continue
            found = re.match(r"(\w+)\s*:", stripped)
            if found and said:
                out[found.group(1)] = " ".join(said)
            said = []
    return out
