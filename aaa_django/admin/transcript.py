"""A run as a transcript (``<run>/transcript/``): a conversation's turns, each the
person's message, what the run did for it (tool calls folded in, questions to people
with their answers) and its reply, with the turn's model calls, tokens and cost; and
the form that answers a pending question (``<run>/answer/``: the run's owner, or
whoever holds ``aaa.answer_run``), its answer checked against the question's schema.
The answer goes through the engine (:mod:`aaa_django.runtime.conversation`), as over
the REST API."""

from __future__ import annotations

import json

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_POST

from aaa_django.reading import transcript
from aaa_django.runtime import conversation
from aaa_django.runtime.conversation import ConversationError

from . import engine
from .actions import RunAdminViews


class RunTranscript(RunAdminViews):
    """Views mixed into :class:`~aaa_django.admin.runs.RunAdmin`: the transcript page
    and the answer to a question."""

    def transcript_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.get_run(request, object_id)
        t = transcript.load(run.run_id, using=self._using())
        ctx = self._context(
            request,
            run,
            title=f"Transcript of run {run.run_id}",
            crumb="transcript",
            transcript=t,
            totals={
                "tokens": sum(x.tokens for x in t.turns),
                "cost": sum(x.cost for x in t.turns),
                "model_calls": sum(x.model_calls for x in t.turns),
            },
            schemas={q.id: json.dumps(q.schema, indent=2, sort_keys=True) for x in t.turns for q in x.questions},
        )
        return TemplateResponse(request, "aaa/admin/transcript.html", ctx)

    def answer_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return require_POST(self._answer)(request, object_id)

    def _answer(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.get_run(request, object_id, "answer")
        back = self._url("transcript", run.run_id)
        question_id = request.POST.get("question_id") or ""
        try:
            value = json.loads(request.POST.get("answer") or "")
        except ValueError as exc:
            messages.error(request, f"The answer is not JSON: {exc}")
            return _redirect(back)
        by = engine.who(request.user)
        try:
            engine.call(lambda e: conversation.answer(e, run.run_id, question_id, value, by=by))
        except engine.EngineUnavailable as exc:
            messages.error(request, f"The engine did not answer: {exc}")
            return _redirect(back)
        except ConversationError as exc:
            detail = "; ".join(f"{'/'.join(map(str, e['loc'])) or 'the answer'}: {e['msg']}" for e in exc.errors)
            messages.error(request, f"Not recorded: {exc}" + (f" ({detail})" if detail else ""))
            return _redirect(back)
        messages.success(request, "Answered: the run goes on.")
        return _redirect(back)


def _redirect(url: str) -> HttpResponse:
    return HttpResponseRedirect(url)
