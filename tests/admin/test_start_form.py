"""The admin's "Start a run" form, built from the chosen algorithm's schemas: a field
per key of its input and config, the site's tools as checkboxes, the budget and the
deadline; errors beside their field; raw JSON as the advanced option."""

from __future__ import annotations

import html
import json
import re

from django import forms
from django.urls import reverse

from aaa_django.admin.schemaform import LinesField
from aaa_django.admin.startform import TOOLS
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.event_types import RUN_STARTED

from . import support
from .test_run_pages import run_url, text

ADD = "admin:aaa_runrecord_add"
LOOP = "aaa.algos.ToolLoop"
#: the site's tools in these tests (AAA["TOOLS"], see conftest's ``site``)
SITE_TOOLS = ["lookup", "deploy", "fetch"]


def add_url(algorithm: str | None = None) -> str:
    return reverse(ADD) + (f"?algorithm={algorithm}" if algorithm else "")


def started(run_id: str) -> dict:
    return json.loads(EventRecord.objects.get(stream=run_id, type=RUN_STARTED).data)


def tool_names(tools: list) -> list[str]:
    """The names of a run's ``config.tools``: names as the form sent them, or the specs
    the engine resolved them to (or the form sent, where the config takes specs)."""
    return [t if isinstance(t, str) else t["name"] for t in tools]


def errors_of(page: str, field: str) -> str:
    """The text of the error list beside ``field`` ("" if none)."""
    found = re.search(rf'<ul class="errorlist" id="errors-{re.escape(field)}">(.*?)</ul>', page, re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", found.group(1))) if found else ""


def post(client, algorithm: str = LOOP, **fields) -> object:
    data = {"algorithm": algorithm, "shown_for": algorithm, **fields}
    return client.post(reverse(ADD), data)


def test_the_form_of_toolloop_has_a_field_per_key_the_sites_tools_budget_and_deadline(client, operator, site):
    client.force_login(operator)
    r = client.get(reverse(ADD))  # ToolLoop unless another is chosen
    assert r.status_code == 200
    form = r.context["form"]
    assert form["algorithm"].value() == LOOP
    fields = form.fields
    # the input: its one key, required, as the model says (at least one character)
    assert fields["input__task"].required and fields["input__task"].min_length == 1
    # the config: each key its field, defaults and bounds from LoopConfig
    assert type(fields["config__max_turns"]).__name__ == "IntegerField"
    assert fields["config__max_turns"].initial == 10 and fields["config__max_turns"].min_value == 1
    assert fields["config__output_retries"].min_value == 0
    assert "Default: 10." in fields["config__max_turns"].help_text
    assert "model calls allowed" in fields["config__max_turns"].help_text.lower()  # its #: comment
    for key in ("system", "model", "output"):
        assert type(fields[f"config__{key}"]).__name__ == "CharField"
        assert not fields[f"config__{key}"].required
    assert isinstance(fields["config__output_schema"], forms.JSONField)  # a dict: JSON for that key
    # the site's tools as checkboxes, all offered unless unticked
    assert [name for name, _ in fields[TOOLS].choices] == SITE_TOOLS
    assert fields[TOOLS].initial == SITE_TOOLS
    # budget and deadline
    for key in ("tokens", "cost", "model_calls", "tool_calls"):
        assert f"budget__{key}" in fields
    assert "deadline" in fields and "input_json" in fields and "config_json" in fields

    page = text(r)
    assert re.search(r'<textarea name="input__task"[^>]*required', page)
    assert re.search(r'<input type="number" name="config__max_turns" value="10"[^>]*min="1"', page)
    for name in SITE_TOOLS:
        assert re.search(rf'<input type="checkbox" name="{TOOLS}" value="{name}"[^>]*checked', page), name
    assert "Look a topic up" in page  # a tool's description beside its box
    assert re.search(r'<textarea name="config__output_schema"[^>]*>\s*</textarea>', page)  # none, not "null"
    assert "<summary>Advanced: raw JSON</summary>" in page


def test_other_algorithms_get_their_own_fields(client, operator, site):
    client.force_login(operator)
    fields = client.get(add_url("aaa.algos.SelfConsistency")).context["form"].fields
    assert fields["config__n"].min_value == 1 and fields["config__n"].max_value == 64
    assert type(fields["config__temperature"]).__name__ == "FloatField"
    assert fields["config__temperature"].initial == 0.7
    assert TOOLS not in fields  # SelfConsistency's config has no tools
    fields = client.get(add_url("aaa.algos.FSM")).context["form"].fields
    assert isinstance(fields["config__finals"], LinesField)  # list[str]: one a line
    assert isinstance(fields["config__states"], forms.JSONField)  # dict of objects: JSON
    fields = client.get(add_url("aaa.algos.GenerateTestRepair")).context["form"].fields
    assert [c for c, _ in fields["config__extract"].choices] == ["fenced", "text"]  # a Literal


def test_choosing_another_algorithm_without_the_script_redraws_the_form(client, operator, site):
    client.force_login(operator)
    r = client.post(reverse(ADD), {"algorithm": "aaa.algos.SelfConsistency", "shown_for": LOOP, "input__task": "x"})
    assert r.status_code == 302 and r["Location"] == add_url("aaa.algos.SelfConsistency")
    assert not RunRecord.objects.exists()
    page = text(client.get(r["Location"]))
    assert 'name="config__n"' in page and 'name="config__max_turns"' not in page


def test_errors_show_beside_their_field_and_start_nothing(client, operator, site):
    client.force_login(operator)
    r = post(
        client,
        **{
            "input__task": "",
            "config__max_turns": "0",
            "config__output": "no.such:Model",
            "budget__tokens": "-1",
            "deadline": "soon",
        },
    )
    assert r.status_code == 200
    page = text(r)
    assert "required" in errors_of(page, "input__task")
    assert "greater than or equal to 1" in errors_of(page, "config__max_turns")
    # pydantic's error (LoopConfig's validator: a model this process has not loaded), at its key
    assert "no.such:Model" in errors_of(page, "config__output")
    assert "greater than or equal to 0" in errors_of(page, "budget__tokens")
    assert "number" in errors_of(page, "deadline")

    # a tool ticked that the site does not serve
    page = text(post(client, **{"input__task": "x", TOOLS: ["rm_rf"]}))
    assert "rm_rf is not one of the available choices" in errors_of(page, TOOLS)

    # the raw JSON: not JSON, or not what the schemas say, said beside it
    page = text(post(client, input_json="{not json"))
    assert "the input is not JSON" in errors_of(page, "input_json")
    page = text(post(client, input_json='{"task": ""}', config_json='{"max_turns": 0, "colour": "red"}'))
    assert "task: String should have at least 1 character" in errors_of(page, "input_json")
    assert "max_turns: Input should be greater than or equal to 1" in errors_of(page, "config_json")
    assert "colour: Extra inputs are not permitted" in errors_of(page, "config_json")

    r = client.post(reverse(ADD), {"algorithm": "no.such.algo", "input_json": "{}"})
    assert r.status_code == 200 and "no.such.algo" in errors_of(text(r), "algorithm")
    assert not RunRecord.objects.exists()


def test_a_start_check_of_the_engine_shows_beside_its_field(operator, site):
    """What the engine's start checks refuse (a cost budget over an unpriced model:
    ``loc`` ["budget", "cost"]) goes beside the budget's cost."""
    from aaa_django.admin.startform import StartRunForm

    form = StartRunForm(
        {"algorithm": LOOP, "shown_for": LOOP, "input__task": "x", "budget__cost": "1"}, algorithm=LOOP, tools=list
    )
    assert form.is_valid(), form.errors
    form.add_start_errors([{"loc": ["budget", "cost"], "msg": "model 'm' has no price"}])
    assert form.errors == {"budget__cost": ["model 'm' has no price"]}


def test_the_form_starts_a_toolloop_offering_the_ticked_tools(client, operator, site):
    client.force_login(operator)
    r = post(
        client,
        **{
            "input__task": "look it up",
            "config__max_turns": "3",
            "config__system": "Be brief.",
            TOOLS: ["lookup"],
            "budget__tokens": "100000",
            "deadline": "120",
        },
    )
    assert r.status_code == 302, r.context["form"].errors if r.context else r
    run = RunRecord.objects.get()
    assert r["Location"] == run_url(run.run_id)
    assert run.owner == operator and run.algorithm == LOOP
    data = started(run.run_id)
    assert data["input"] == {"task": "look it up"}
    assert data["config"]["max_turns"] == 3 and data["config"]["system"] == "Be brief."
    assert tool_names(data["config"]["tools"]) == ["lookup"]  # only the ticked one
    assert data["budget"] == {"tokens": 100000}
    assert data["deadline"] is not None
    assert support.wait_until(lambda: (x := RunRecord.objects.get(pk=run.run_id)) and x.outcome) == "success"


def test_no_tool_ticked_offers_none(client, operator, site):
    client.force_login(operator)
    assert post(client, **{"input__task": "answer from memory"}).status_code == 302
    assert started(RunRecord.objects.get().run_id)["config"]["tools"] == []


def test_raw_json_replaces_the_fields_of_its_part(client, operator, site):
    """The advanced option: the whole input or config as JSON (a tool the site does not
    serve is given by its spec there)."""
    client.force_login(operator)
    spec = {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    r = post(
        client,
        **{
            "input__task": "",
            "config__max_turns": "9",
            TOOLS: ["lookup"],
            "input_json": '{"task": "from JSON"}',
            "config_json": json.dumps({"max_turns": 2, "tools": [spec]}),
        },
    )
    assert r.status_code == 302
    data = started(RunRecord.objects.get().run_id)
    assert data["input"] == {"task": "from JSON"}
    assert data["config"]["max_turns"] == 2 and data["config"]["tools"] == [spec]
