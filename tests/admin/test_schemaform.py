"""Form fields from a pydantic model, key by key (``aaa_django.admin.schemaform``):
the mapping, what an empty field means, and where a pydantic error goes."""

from __future__ import annotations

import enum
from typing import Any, Literal

from django import forms
from pydantic import BaseModel, Field, ValidationError

from aaa_django.admin.schemaform import JsonField, LinesField, Section


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Settings(BaseModel):
    #: what to ask (a comment the form shows)
    task: str = Field(min_length=2, max_length=50)
    name: str = "anon"
    turns: int = Field(default=3, ge=1, lt=10)
    temperature: float | None = Field(default=0.5, ge=0, le=2, description="Sampling temperature.")
    strict: bool = False
    verbose: bool | None = None
    colour: Colour = Colour.BLUE
    level: Literal[1, 2, 3] = 2
    tags: list[str] = Field(default_factory=list)
    extra: dict[str, Any] | None = None


def section() -> Section:
    return Section(Settings, "config")


def cleaned(data: dict[str, Any]) -> dict[str, Any]:
    s = section()
    form = type("F", (forms.Form,), dict(s.fields))(data)
    assert form.is_valid(), form.errors
    return s.collect(form.cleaned_data)


def test_each_type_gets_its_field_with_bounds_default_and_help():
    f = section().fields
    assert isinstance(f["config__task"], forms.CharField) and f["config__task"].required
    assert (f["config__task"].min_length, f["config__task"].max_length) == (2, 50)
    assert isinstance(f["config__task"].widget, forms.Textarea)  # a task: a text area
    assert isinstance(f["config__name"].widget, forms.TextInput) and f["config__name"].initial == "anon"
    assert isinstance(f["config__turns"], forms.IntegerField)
    assert (f["config__turns"].min_value, f["config__turns"].max_value, f["config__turns"].initial) == (1, 9, 3)
    assert isinstance(f["config__temperature"], forms.FloatField)
    assert (f["config__temperature"].min_value, f["config__temperature"].max_value) == (0, 2)
    assert type(f["config__strict"]) is forms.BooleanField and not f["config__strict"].required
    assert isinstance(f["config__verbose"], forms.NullBooleanField)
    assert f["config__colour"].choices == [("red", "RED"), ("blue", "BLUE")]
    assert f["config__colour"].initial == "blue"
    assert f["config__level"].choices == [("1", "1"), ("2", "2"), ("3", "3")]
    assert isinstance(f["config__tags"], LinesField)
    assert isinstance(f["config__extra"], JsonField)
    assert (
        f["config__task"].help_text == "What to ask (a comment the form shows). At least 2 character(s), "
        "at most 50 character(s)."
    )
    assert (
        f["config__temperature"].help_text == "Sampling temperature. At least 0, at most 2. Default: 0.5. Empty: none."
    )
    assert f["config__turns"].help_text == "At least 1, less than 10. Default: 3."


def test_the_fields_give_back_the_models_data():
    data = cleaned(
        {
            "config__task": "hello",
            "config__name": "",
            "config__turns": "4",
            "config__temperature": "",
            "config__strict": "on",
            "config__verbose": "true",
            "config__colour": "red",
            "config__level": "3",
            "config__tags": "a\n\n b \n",
            "config__extra": '{"k": [1]}',
        }
    )
    # an empty key with a default is left out; one that may be null is null; choices are
    # their values (JSON), as an enum or Literal validates them
    assert data == {
        "task": "hello",
        "turns": 4,
        "temperature": None,
        "strict": True,
        "verbose": True,
        "colour": "red",
        "level": 3,
        "tags": ["a", "b"],
        "extra": {"k": [1]},
    }  # JSON-ready
    model = Settings.model_validate(data)
    assert model.name == "anon" and model.colour is Colour.RED and model.level == 3
    # unchecked is False; an unset yes/no is null
    data = cleaned({"config__task": "hi", "config__colour": "blue", "config__level": "2"})
    assert data["strict"] is False and data["verbose"] is None and "tags" not in data


def test_a_pydantic_error_names_its_field():
    s = section()
    try:
        Settings.model_validate({"task": "x", "tags": ["ok", 3]})
    except ValidationError as exc:
        places = [s.field_for(e["loc"]) for e in exc.errors()]
    assert places == ["config__task", "config__tags"]
    assert s.field_for(()) is None and s.field_for(("nope",)) is None
