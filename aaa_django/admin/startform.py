"""The admin's "Start a run" form, built from the chosen algorithm's schemas.

One field per key of the algorithm's ``Input`` and ``Config`` (pydantic models to
Django form fields: :mod:`.schemaform`), the site's tools as checkboxes when the
config has ``tools``, the ``Budget``'s four limits and a deadline; and, as an advanced
option, the whole input or the whole config as raw JSON (which then replaces that
part's fields). Every error shows beside the field it is about: pydantic's errors are
mapped to their key's field by their ``loc``.

The ticked tools go into ``config.tools`` as their names when the config's ``tools``
takes names (the engine resolves them to the site's specs), else as the tools' JSON
specs.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from django import forms
from django.forms.boundfield import BoundField
from pydantic import BaseModel, ValidationError

from aaa_django.data.jsonvalue import JSONObject, JSONValue
from aaa_django.runtime import Budget, registry
from aaa_django.validate import validate

from .schemaform import Section, sentence

#: the algorithm the form shows when none is chosen, if registered
DEFAULT_ALGORITHM = "aaa.algos.ToolLoop"
#: the config key that lists the tools a run offers its model
TOOLS = "config__tools"

BUDGET_HELP = {
    "tokens": "Input and output tokens; the run ends budget_exceeded once over.",
    "cost": "Dollars, from the model's price table; the run ends budget_exceeded once over.",
    "model_calls": "Model calls allowed; the one after the last is refused.",
    "tool_calls": "Tool calls allowed; the one after the last is refused.",
}


def default_algorithm() -> str | None:
    names = registry.names()
    if DEFAULT_ALGORITHM in names:
        return DEFAULT_ALGORITHM
    return names[0] if names else None


def chosen_algorithm(raw: object) -> str | None:
    """The algorithm a request names (``?algorithm=``), if registered, else the default."""
    return raw if isinstance(raw, str) and registry.known(raw) else default_algorithm()


@dataclass(frozen=True)
class SiteTool:
    name: str
    description: str
    spec: JSONObject


def site_tools() -> list[SiteTool]:
    """The tools the site's engines run (``AAA["TOOLS"]``, MCP servers', agents')."""
    from aaa_django.site.engines import site_tools as tools

    out = []
    for t in tools():
        spec = dict(t.spec())
        out.append(SiteTool(name=t.name, description=str(spec.get("description") or ""), spec=spec))
    return out


def takes_names(model: type[BaseModel]) -> bool:
    """Whether the model's ``tools`` key takes tool names (strings)."""
    info = model.model_fields.get("tools")
    if info is None or get_origin(info.annotation) is not list:
        return False
    args = get_args(info.annotation)
    item = args[0] if args else None
    options = get_args(item) if get_origin(item) in (Union, types.UnionType) else (item,)
    return str in options


@dataclass
class Part:
    """A group of the form's fields, shown as one fieldset."""

    title: str
    fields: list[BoundField]
    note: str = ""
    advanced: bool = False


class StartRunForm(forms.Form):
    """Start a run of ``algorithm`` (see the module).

    ``tools``: where the site's tools come from (:func:`site_tools`; a test may give
    its own). The view redraws the form for another algorithm when the posted
    ``algorithm`` is not the one the fields were drawn for (``shown_for``).
    """

    algorithm = forms.ChoiceField(help_text="The algorithms registered in this process.")
    shown_for = forms.CharField(widget=forms.HiddenInput, required=False)
    deadline = forms.FloatField(
        required=False, min_value=0.001, label="deadline", help_text="Seconds from now. Empty: none."
    )
    input_json = forms.CharField(
        required=False,
        label="input (JSON)",
        widget=forms.Textarea(
            attrs={"rows": 4, "cols": 80, "class": "vLargeTextField aaa-json", "spellcheck": "false"}
        ),
        help_text="The whole input as JSON, instead of the input's fields above.",
    )
    config_json = forms.CharField(
        required=False,
        label="config (JSON)",
        widget=forms.Textarea(
            attrs={"rows": 4, "cols": 80, "class": "vLargeTextField aaa-json", "spellcheck": "false"}
        ),
        help_text="The whole config as JSON, instead of the config's fields and tools above "
        '(tools the site does not serve: give their JSON specs in "tools").',
    )

    def __init__(
        self,
        data: Mapping[str, Any] | None = None,
        *,
        algorithm: str | None,
        tools: Callable[[], list[SiteTool]] = site_tools,
    ) -> None:
        super().__init__(data)
        self.name = algorithm
        self.fields["algorithm"].choices = [(n, n) for n in registry.names()]
        self.fields["algorithm"].initial = algorithm
        self.fields["shown_for"].initial = algorithm
        cls = registry.get(algorithm) if algorithm and registry.known(algorithm) else None
        self.cls = cls
        schema = getattr(cls, "Input", None)
        self.input = Section(schema, "input") if schema is not None and _is_model(schema) else None
        config = getattr(cls, "Config", None)
        self.config_model = config if _is_model(config) else None
        self.tools: list[SiteTool] = []
        self.tools_error = ""
        self.tool_names = False
        self.config_order: list[str] = []
        skip: tuple[str, ...] = ()
        if self.config_model is not None and "tools" in self.config_model.model_fields:
            try:
                self.tools = tools()
            except Exception as exc:  # an MCP server down: the tools are JSON, said why
                self.tools_error = f"The site's tools cannot be listed now ({type(exc).__name__}: {exc})."
            if self.tools:
                skip = ("tools",)
                self.tool_names = takes_names(self.config_model)
                self.config_order = [TOOLS if k == "tools" else f"config__{k}" for k in self.config_model.model_fields]
        self.config = Section(self.config_model, "config", skip=skip) if self.config_model else None
        self.budget = Section(Budget, "budget")
        for key in self.budget.keys:
            field = self.budget.fields[key.field]
            field.help_text = f"{BUDGET_HELP.get(key.name, '')} {field.help_text}".strip()
        fields: dict[str, forms.Field] = {}
        for section in (self.input, self.config):
            if section is not None:
                fields.update(section.fields)
        if self.tools:
            fields[TOOLS] = forms.MultipleChoiceField(
                label="tools",
                required=False,
                widget=forms.CheckboxSelectMultiple,
                choices=[(t.name, f"{t.name}: {t.description}" if t.description else t.name) for t in self.tools],
                initial=[t.name for t in self.tools],
                help_text="The site's tools the model is offered (ticked: offered).",
            )
        fields.update(self.budget.fields)
        self.fields.update(fields)
        self.order_fields(
            ["algorithm", "shown_for", *self._config_first(fields), "deadline", "input_json", "config_json"]
        )
        if data is not None:  # raw JSON replaces that part's fields
            if self.input is not None and str(data.get("input_json") or "").strip():
                self.input.loosen()
            if self.config is not None and str(data.get("config_json") or "").strip():
                self.config.loosen()
        if self.input is None:
            self.fields[
                "input_json"
            ].help_text = "This algorithm declares no input schema: its input is this JSON (empty: null)."

    def _config_first(self, fields: dict[str, forms.Field]) -> list[str]:
        """The fields in order, the tools where the config declares them."""
        if not self.config_order:
            return list(fields)
        rest = [n for n in fields if n not in self.config_order]
        inputs = [n for n in rest if n.startswith("input__")]
        return [*inputs, *self.config_order, *[n for n in rest if n not in inputs]]

    # -- what the template shows ----------------------------------------------------------

    def parts(self) -> list[Part]:
        def bound(names: Iterable[str]) -> list[BoundField]:
            return [self[n] for n in names if n in self.fields]

        out = [Part("Algorithm", bound(["algorithm"]), note=_summary(self.cls))]
        if self.input is not None:
            out.append(Part("Input", bound(self.input.fields)))
        if self.config is not None:
            names = self.config_order if self.tools else list(self.config.fields)
            out.append(Part("Config", bound(names), note=self.tools_error))
        out.append(Part("Budget and deadline", bound([*self.budget.fields, "deadline"])))
        out.append(Part("Advanced: raw JSON", bound(["input_json", "config_json"]), advanced=True))
        return out

    def advanced_open(self) -> bool:
        return self.input is None or any(
            self[n].errors or str(self[n].value() or "").strip() for n in ("input_json", "config_json")
        )

    def schemas_text(self) -> str:
        """The algorithm's input and config schemas (for the raw JSON)."""
        out = {}
        for part, model in (("input", getattr(self.cls, "Input", None)), ("config", self.config_model)):
            try:
                out[part] = model.model_json_schema() if model is not None and _is_model(model) else None
            except Exception:
                out[part] = None
        return json.dumps(out, indent=2)

    # -- checking ---------------------------------------------------------------------------

    def clean_input_json(self) -> JSONValue:
        return _parse(self.cleaned_data.get("input_json"), "the input")

    def clean_config_json(self) -> JSONValue:
        value = _parse(self.cleaned_data.get("config_json"), "the config")
        if value is not None and not isinstance(value, dict):
            raise forms.ValidationError("The config is a JSON object.")
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.cls is None or data.get("algorithm") != self.name:
            return data
        raw_input = self.input is None or bool(str(self.data.get("input_json") or "").strip())
        raw_config = self.config is None or bool(str(self.data.get("config_json") or "").strip())
        if raw_input and "input_json" not in data:
            return data  # not JSON: said beside it
        if raw_config and "config_json" not in data:
            return data
        value = data["input_json"] if raw_input else self.input.collect(data)  # type: ignore[union-attr]
        config = (data["config_json"] or {}) if raw_config else self._config(data)
        for error in validate(self.cls, value):
            self._place(error, "input", "input_json" if raw_input else self.input)
        try:
            data["instance"] = registry.build(self.name or "", config)
        except ValidationError as exc:
            for detail in exc.errors(include_url=False):
                self._place(detail, "config", "config_json" if raw_config else self.config)
        except Exception as exc:
            self.add_error("config_json" if raw_config else None, f"config: {type(exc).__name__}: {exc}")
        data["input"] = value
        data["config"] = config
        budget = self.budget.collect(data)
        try:
            limits = Budget(**budget).model_dump(exclude_none=True)
        except ValidationError as exc:
            for detail in exc.errors(include_url=False):
                self._place(detail, "budget", self.budget)
        else:
            data["budget"] = limits or None
        return data

    def _config(self, data: dict[str, Any]) -> dict[str, Any]:
        assert self.config is not None
        config = self.config.collect(data)
        if self.tools and TOOLS in data:
            ticked = [t for t in self.tools if t.name in set(data[TOOLS])]
            config["tools"] = [t.name if self.tool_names else t.spec for t in ticked]
        return config

    def add_start_errors(self, errors: Iterable[Mapping[str, Any]]) -> None:
        """Errors the engine's start checks give (``loc`` from the run's start:
        ``["budget", "cost"]``), each beside its field."""
        for e in errors:
            loc = list(e.get("loc") or ())
            part = loc[0] if loc else ""
            section = {"budget": self.budget, "config": self.config}.get(str(part))
            self._place({**e, "loc": loc[1:]}, str(part), section)

    def _place(self, error: Mapping[str, Any], part: str, where: Section | str | None) -> None:
        loc = tuple(error.get("loc") or ())
        msg = str(error.get("msg") or "invalid")
        if isinstance(where, Section):
            field = where.field_for(loc)
            if field is not None:
                if field in self.errors:
                    return  # the field's own error says it already
                rest = ".".join(str(p) for p in loc[1:])
                self.add_error(field, f"{rest}: {msg}" if rest else msg)
                return
            if loc and loc[0] == "tools" and part == "config" and self.tools:
                self.add_error(TOOLS, f"{'.'.join(str(p) for p in loc[1:])}: {msg}".lstrip(": "))
                return
            where = None
        path = ".".join(str(p) for p in loc)
        self.add_error(where, f"{part}{'.' + path if path else ''}: {msg}")


def _is_model(model: object) -> bool:
    return isinstance(model, type) and issubclass(model, BaseModel)


def _parse(raw: object, what: str) -> JSONValue:
    text = str(raw or "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise forms.ValidationError(f"{what} is not JSON: {exc}") from None


def _summary(cls: object) -> str:
    """The first paragraph of the algorithm's docstring."""
    doc = (getattr(cls, "__doc__", None) or "").strip()
    return sentence(doc.split("\n\n")[0]) if doc else ""
