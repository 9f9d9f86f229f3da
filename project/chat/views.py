"""The chat page: Django templates, and a small script (``static/chat/chat.js``) over
the REST API (start the conversation, send messages, answer questions) and the run's
event stream (replies as they are written, the run's status, questions)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from aaa_django.conf import aaa_settings
from aaa_django.models import RunRecord

from project.api_demo import lookup_population

from .model import CHAT_MODEL, SYSTEM, choose_city

LOGIN_URL = "/chat/login/"


def start_body(scripted: bool) -> dict:
    """What the page posts to ``POST /api/aaa/runs`` (its ``input.task`` added): a
    ToolLoop conversation with the chat agent's instructions and tools."""
    tools = [choose_city.spec(), lookup_population.spec()]
    config = {"system": SYSTEM, "tools": tools, "max_turns": 6}
    if scripted:
        config["model"] = CHAT_MODEL
    return {"algorithm": "aaa.algos.ToolLoop", "config": config, "conversation": True}


@login_required(login_url=LOGIN_URL)
@ensure_csrf_cookie  # the script sends it with its POSTs (the API checks it for a session)
def chat(request: HttpRequest) -> HttpResponse:
    """The page; ``?run=<id>`` opens one of the user's conversations again."""
    scripted = not aaa_settings().get("LLM")
    recent = RunRecord.objects.filter(owner=request.user, algorithm="aaa.algos.ToolLoop").order_by("-started_at")[:8]
    return render(
        request,
        "chat/index.html",
        {
            "start": start_body(scripted),
            "run_id": request.GET.get("run", ""),
            "recent": recent,
            "scripted": scripted,
        },
    )


login = LoginView.as_view(template_name="chat/login.html", next_page="/chat/")
