"""The Celery adapter's place in the site's wiring, taken when the app is ready.

``AaaConfig.ready`` calls :func:`register` where Celery is installed: ``AAA["BUS"] =
"celery"`` then builds a :class:`~aaa_django.celery.bus.DistributedBus`
(:func:`aaa_django.site.buses.register_bus`), the broker URL is read from the site's
Celery app (:func:`aaa_django.conf.set_broker`: the Redis of a Redis broker doubles as
the bus's), and every worker this process starts runs the periodic duty
(:mod:`aaa_django.celery.duty`). The arrows point down: this package knows the site's
wiring; the wiring knows no bus but the one it is given.
"""

from __future__ import annotations

from aaa_django.conf import set_broker
from aaa_django.site.buses import register_bus

from .bus import DistributedBus, celery_app
from .duty import install


def broker_url() -> str | None:
    """The broker URL of the site's Celery app."""
    return celery_app().conf.broker_url or None


def register() -> None:
    """Register the Celery bus, its broker, and the workers' duty."""
    register_bus("celery", DistributedBus)
    set_broker(broker_url)
    install()
