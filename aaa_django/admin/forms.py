"""Forms of the admin's actions: the reason given for an action, forking, importing
(starting a run: :mod:`.startform`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from django import forms
from pydantic import ValidationError

from aaa_django.runtime import Budget

#: the longest reason kept in an event
MAX_REASON = 500


class ReasonForm(forms.Form):
    reason = forms.CharField(required=False, max_length=MAX_REASON)


class ApprovalForm(ReasonForm):
    request_id = forms.CharField(max_length=200)


def _json_field(label: str, help_text: str, required: bool) -> forms.CharField:
    return forms.CharField(
        label=label,
        required=required,
        help_text=help_text,
        widget=forms.Textarea(
            attrs={"rows": 6, "cols": 80, "class": "vLargeTextField aaa-json", "spellcheck": "false"}
        ),
    )


def _errors(exc_errors: Iterable[Mapping[str, Any]]) -> list[str]:
    out = []
    for e in exc_errors:
        where = ".".join(str(p) for p in e.get("loc", ())) or "(the whole value)"
        out.append(f"{where}: {e.get('msg', 'invalid')}")
    return out


class JsonConfigForm(forms.Form):
    """A configuration, a budget and a deadline as JSON (the fork's form)."""

    config = _json_field("Config (JSON)", "The algorithm's config.", False)
    budget = _json_field(
        "Budget (JSON)", 'Optional: {"tokens": …, "cost": …, "model_calls": …, "tool_calls": …}.', False
    )
    deadline = forms.FloatField(required=False, min_value=0.001, help_text="Optional: seconds from now.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("config", "budget"):
            self.fields[name].widget.attrs["rows"] = 3

    def _parse(self, name: str) -> Any:
        raw = (self.cleaned_data.get(name) or "").strip()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from None

    def clean_config(self) -> Any:
        value = self._parse("config")
        if value is not None and not isinstance(value, dict):
            raise forms.ValidationError("the config is a JSON object")
        return value or {}

    def clean_budget(self) -> Any:
        value = self._parse("budget")
        if value is None:
            return None
        if not isinstance(value, dict):
            raise forms.ValidationError("the budget is a JSON object")
        try:
            return Budget(**value).model_dump(exclude_none=True)
        except ValidationError as exc:
            raise forms.ValidationError(_errors(exc.errors(include_url=False))) from None
        except TypeError as exc:
            raise forms.ValidationError(str(exc)) from None


class ImportForm(forms.Form):
    """An export file (``aaa_export``, the API's or this admin's Export)."""

    file = forms.FileField(help_text="A run exported as JSON Lines, its blobs inlined.")


class ForkForm(JsonConfigForm):
    """Where to fork (the seq of the last event kept) and the new run's configuration,
    budget and deadline (the original's, edited)."""

    at = forms.IntegerField(
        min_value=1,
        label="Keep events 1 to",
        help_text="The new run starts from the run's log up to this event "
        "and decides anew after it: pick the event before the "
        "decision to redo.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["config"].help_text = "The algorithm's config for the new run (edit it)."
        self.fields[
            "budget"
        ].help_text = "The new run's budget; empty: none. What the kept events spent counts against it."
        self.fields["deadline"].help_text = "Seconds from now; empty: as long as the run had."
        self.order_fields(["at", "config", "budget", "deadline"])

    @staticmethod
    def initial_for(run: Any, started: dict[str, Any], query: Any) -> dict[str, Any]:
        at = query.get("at")
        return {
            "at": int(at) if str(at or "").isdigit() else max(run.last_seq - 1, 1),
            "config": json.dumps(started.get("config") or {}, indent=2, ensure_ascii=False),
            "budget": json.dumps(started["budget"], ensure_ascii=False) if started.get("budget") else "",
        }

    def clean_deadline(self) -> Any:
        value = self.cleaned_data.get("deadline")
        return ... if value is None else value
