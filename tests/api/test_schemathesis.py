"""Property-based fuzzing of every endpoint from the OpenAPI schema (schemathesis).

The test site's WSGI application is called in-process. Every operation gets the
schema's explicit examples, the coverage phase's boundary values and a bounded number
of generated cases (valid and invalid), sent with a valid API key. Every response
must be a non-5xx whose status code, content type, headers and body match the schema.
"""

from __future__ import annotations

import pytest
import schemathesis

# schemathesis imports these lazily, deep inside hypothesis' stack; pytest rewrites
# schemathesis' modules (it is a pytest plugin), and compiling one that deep can hit a
# CPython 3.11 bug ("AST constructor recursion depth mismatch"). Import them up front.
import schemathesis.core.error_feedback.collector
import schemathesis.specs.openapi.adapter.security
import schemathesis.specs.openapi.object_authorization
import schemathesis.specs.openapi.validation
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from aaa_django.runtime.event_types import INPUT_VALIDATED, RUN_COMPLETED

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {"max-examples": 30, "deterministic": True},
        "phases": {"stateful": {"enabled": False}},
    }
)

# POST /imports takes a run's export as JSON Lines: text, sent as it is generated.
schemathesis.serializer.alias("application/jsonl", "text/plain")

schema = schemathesis.openapi.from_wsgi("/api/aaa/openapi.json", get_wsgi_application(), config=CONFIG)

#: a run that exists, so its id (from the examples below) reaches the happy paths
RUN_ID = "run-fuzz-done"

# A schema-valid request may still name an unknown run (404) or an unregistered
# algorithm (422): "valid data must be accepted" does not hold for this API.
EXCLUDED = [positive_data_acceptance]


@pytest.fixture
def world(host, alice, make_run, settings):
    # a stream that follows (the change stream) closes after a second, not five minutes
    settings.AAA = {**settings.AAA, "API_STREAM_SECONDS": 1}
    make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED], run_id=RUN_ID)
    return alice


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=30)
def test_every_endpoint_matches_its_schema_and_never_fails(case, world):
    case.call_and_validate(headers=world.auth, excluded_checks=EXCLUDED)
