"""The distributed bus over Celery (``AAA["BUS"] = "celery"``).

- :mod:`.bus`: :class:`~aaa_django.celery.bus.DistributedBus` (the engine's bus:
  a delivery per event, after its commit);
- :mod:`.tasks`: the tasks ``aaa.deliver`` and ``aaa.sweep`` (found by Celery's
  autodiscovery through ``aaa_django.tasks``);
- :mod:`.worker`: a worker's loop and engine, and the delivery of one event;
- :mod:`.publish`: :class:`~aaa_django.celery.publish.FastPublisher`, the message
  ``send_task`` sends, for less;
- :mod:`.coordination`: what workers agree on through Redis (locks, leases, notices);
- :mod:`.sweeper`: re-drives runs nothing is working on any more.

Imports of the Celery library are absolute (``from celery import ...``), so this
package's name never shadows it.
"""
