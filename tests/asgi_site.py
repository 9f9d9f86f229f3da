"""The ASGI application of the server process the tests start: the example site's
``project/asgi.py`` on the test settings (tests/asgi_settings.py), with the test
algorithms registered."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.asgi_settings")

from project.asgi import application  # noqa: E402,F401

from tests.api import algos  # noqa: E402,F401  (registers the test algorithms)
