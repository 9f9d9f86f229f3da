"""A bug in the API is reported the way Django reports any view's: the
``got_request_exception`` signal fires (Sentry's and other integrations' hook) and the
error is logged on ``django.request`` (where ``mail_admins`` listens); the client
still gets the API's JSON 500."""

from __future__ import annotations

import django
import pytest
from django.core import mail
from django.core.signals import got_request_exception
from django.test import Client

from aaa_django.api import runs

pytestmark = pytest.mark.django_db


def test_an_unexpected_error_fires_got_request_exception_and_mails_the_admins(alice, monkeypatch, settings):
    # (Django 6.0 takes addresses; (name, address) pairs, which 5.2 takes, are deprecated there)
    settings.ADMINS = ["ops@example.com"] if django.VERSION >= (6, 0) else [("Ops", "ops@example.com")]

    def broken(*args, **kwargs):
        raise RuntimeError("the index is on fire")

    monkeypatch.setattr(runs, "load", broken)
    seen = []

    def receiver(sender, request, **kwargs):
        import sys

        seen.append((request.path, sys.exc_info()[1]))

    got_request_exception.connect(receiver)
    client = Client(raise_request_exception=False)  # as a server does: answer, don't raise
    try:
        r = client.get("/api/aaa/runs/run-1", headers=alice.auth)
    finally:
        got_request_exception.disconnect(receiver)

    assert r.status_code == 500
    assert r["Content-Type"] == "application/json"
    assert r.json() == {"detail": [{"loc": ["server"], "msg": "internal error (logged)", "type": "server_error"}]}
    ((path, exc),) = seen
    assert path.endswith("/runs/run-1") and str(exc) == "the index is on fire"
    (message,) = mail.outbox
    assert message.to == ["ops@example.com"]
    assert "RuntimeError at /api/aaa/runs/run-1" in message.body  # the traceback
    assert "raise RuntimeError" in message.body
