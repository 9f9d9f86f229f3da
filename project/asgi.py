"""ASGI entry point for the example site."""

import os

from django.core.asgi import get_asgi_application

from project.collector import tune

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

application = get_asgi_application()

# The collector as the site sets it for a process carrying many runs (project/collector.py).
tune()
