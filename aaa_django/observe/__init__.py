"""Observers of the engine beyond the Django signals (:mod:`aaa_django.signals`):
OpenTelemetry traces and metrics (:mod:`aaa_django.observe.otel`, the ``otel`` extra).

Nothing here is imported unless the site turns it on (``AAA["OTEL"]``).
"""
