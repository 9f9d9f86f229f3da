"""The contract's file: the router's OpenAPI schema as a site serves it, without the site.

:func:`schema` builds it from a ``NinjaAPI`` of its own (title and version from
:mod:`.contract`), its paths relative to where a site mounts the router (``/runs``, not
``/api/aaa/runs``). :data:`FILE` holds it in the package; ``manage.py aaa_openapi``
writes it (``--check``: exit status 1 when it is not current).

:func:`served_part` takes from the schema a site serves what the contract fixes
(everything but the site's title, description and mount point), so the two compare.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ninja import NinjaAPI

from . import contract
from .router import router

#: the checked-in schema
FILE = Path(__file__).with_name("openapi.json")


def schema() -> dict[str, Any]:
    """The router's OpenAPI schema, as the contract states it (as JSON reads it back)."""
    api = NinjaAPI(
        title=contract.TITLE, version=contract.VERSION, description=contract.DESCRIPTION, urls_namespace="aaa-contract"
    )
    api.add_router("/", router)
    # as JSON has it: ninja keys most responses by int, the file (and a client) by text
    return same_phrases(json.loads(json.dumps(api.get_openapi_schema(path_prefix=""))))


#: ninja describes a response by Python's phrase for its status (``http.client.responses``),
#: which Python 3.13 changed to RFC 9110's names for these: the contract keeps the
#: earlier ones, whichever Python builds it
PHRASES = {
    "Content Too Large": "Request Entity Too Large",
    "URI Too Long": "Request-URI Too Long",
    "Range Not Satisfiable": "Requested Range Not Satisfiable",
    "Unprocessable Content": "Unprocessable Entity",
}


def same_phrases(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its responses' descriptions as :data:`PHRASES` has them (in place)."""
    for item in doc.get("paths", {}).values():
        for operation in item.values():
            responses = operation.get("responses", {}) if isinstance(operation, dict) else {}
            for response in responses.values():
                described = response.get("description")
                if described in PHRASES:
                    response["description"] = PHRASES[described]
    return doc


def render(doc: dict[str, Any]) -> str:
    """The file's text for a schema (what :data:`FILE` holds)."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def checked_in() -> dict[str, Any]:
    return json.loads(FILE.read_text(encoding="utf-8"))


def served_part(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    """What the contract fixes of a schema a site serves with the router mounted at
    ``prefix`` (``"/api/aaa"``): its OpenAPI version, ``info.version``, the paths
    relative to the mount point, the components (the responses' descriptions as the
    contract words them: :func:`same_phrases`)."""
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    paths = {}
    for path, item in doc.get("paths", {}).items():
        if not path.startswith(prefix + "/"):
            continue  # another router of the site's
        paths[path[len(prefix) :]] = item
    paths = same_phrases({"paths": json.loads(json.dumps(paths))})["paths"]
    return {
        "openapi": doc.get("openapi"),
        "version": doc.get("info", {}).get("version"),
        "paths": paths,
        "components": doc.get("components", {}),
    }
