"""The REST API's public contract: its version, and the tags its operations are grouped by.

The contract is the OpenAPI schema of the router, checked into the package beside this
module (``openapi.json``, written by ``manage.py aaa_openapi``: :mod:`.openapi`). Every
operation has a stable ``operationId`` (``start_run``, ``get_run``...: what a generated
client names its functions after) and one of the tags below (a generated client's
modules).

:data:`VERSION` is the schema's ``info.version`` (a site mounting the router gives it
to its ``NinjaAPI``), by semantic versioning: a change a client generated from the
previous schema may not survive (an operation renamed or removed, a field removed or
made required, a type narrowed) raises the major number; an addition (an operation, an
optional field or parameter) the minor one; a correction of a description the patch
one. The suite refuses a schema that changed under a version an earlier schema had
(``tests/api/test_contract.py``).
"""

from __future__ import annotations

#: the contract's version: ``info.version`` of the schema
VERSION = "3.0.0"
#: the schema's title in ``openapi.json`` (a site's own ``NinjaAPI`` has its own)
TITLE = "aaa_django REST API"
DESCRIPTION = "Durable LLM agent runs: start, watch, answer, cancel, erase, export and import them (docs/api.md)."

# The tags: one per group of operations.
RUNS = "runs"
EVENTS = "events"
APPROVALS = "approvals"
EXCHANGE = "exchange"
CONVERSATIONS = "conversations"
TAGS = (RUNS, EVENTS, APPROVALS, EXCHANGE, CONVERSATIONS)
