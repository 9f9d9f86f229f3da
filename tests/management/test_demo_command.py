"""The main job's demo: a real ToolLoop run on the site's database with the scripted
model, printed with its outcome (what bin/serve runs before serving)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from aaa_django.models import EventRecord


@pytest.mark.django_db(transaction=True)
def test_the_demo_runs_a_tool_loop_to_success_and_says_the_model_is_scripted():
    out = io.StringIO()
    call_command("aaa_demo", stdout=out)
    text = out.getvalue()
    assert "scripted FakeLLMClient" in text
    assert "Outcome: success" in text
    assert "754,050 inhabitants" in text  # 522,250 + 231,800, from two real tool calls
    types = list(EventRecord.objects.order_by("seq").values_list("type", flat=True))
    assert types[0] == "aaa.run.started" and types[-1] == "aaa.run.completed"
    assert types.count("aaa.tool.completed") == 2
