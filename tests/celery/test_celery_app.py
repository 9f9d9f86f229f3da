"""``aaa_django.celery.bus.celery_app``: the current Celery app itself
(``celery.app.app_or_default()``), not Celery's ``current_app`` proxy of it (the reason
is beside it)."""

from __future__ import annotations

from celery import Celery, current_app
from celery.local import Proxy

from aaa_django.celery.bus import celery_app


def test_it_is_the_current_app_itself_not_a_proxy_of_it():
    before = celery_app()
    app = Celery("aaa_probe", set_as_current=False)
    app.set_current()
    try:
        found = celery_app()
        assert found is app and type(found) is Celery
    finally:
        before.set_current()
    assert celery_app() is before and type(current_app) is Proxy and type(before) is not Proxy
