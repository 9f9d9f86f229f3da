"""Settings of the ASGI server process the tests start (tests/api/test_stream_asgi.py):
the test settings, with the default database the pytest process's PostgreSQL *test*
database (AAA_TEST_ASGI_DB), its connections named ``aaa-asgi-test`` in
pg_stat_activity (the test counts them), and a user's stream cap raised to
AAA_TEST_STREAMS_PER_USER (one user opens 150 streams)."""

import os

from tests.settings import *  # noqa: F401,F403
from tests.settings import DATABASES

DATABASES = {
    "default": {
        **DATABASES["postgres"],
        "NAME": os.environ["AAA_TEST_ASGI_DB"],
        "TEST": {"NAME": os.environ["AAA_TEST_ASGI_DB"]},
        "OPTIONS": {"application_name": "aaa-asgi-test"},
    }
}

AAA = {"API_STREAMS_PER_USER": int(os.environ["AAA_TEST_STREAMS_PER_USER"])}
