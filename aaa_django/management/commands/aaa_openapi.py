"""Write the REST API's OpenAPI schema into the package: its public contract.

    python manage.py aaa_openapi [--check] [--output FILE]

Writes ``aaa_django/api/openapi.json`` (or ``FILE``) from the router
(:mod:`aaa_django.api.openapi`); ``--check`` writes nothing and exits with status 1
when the file is not the router's schema. A schema that changes needs a new
``aaa_django.api.contract.VERSION`` (docs/api.md, "The contract").
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from aaa_django.api import openapi


class Command(BaseCommand):
    help = "Write the REST API's OpenAPI schema (aaa_django/api/openapi.json)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--check", action="store_true", help="write nothing; exit 1 when the file is not the router's schema"
        )
        parser.add_argument("--output", type=Path, default=openapi.FILE, help="the file")

    def handle(self, *args: object, check: bool, output: Path, **options: object) -> None:
        doc = openapi.schema()
        version = doc["info"]["version"]
        if check:
            try:
                current = json.loads(output.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise CommandError(f"{output}: {exc}") from None
            if current != doc:
                raise CommandError(f"{output} is not the router's schema: run manage.py aaa_openapi")
            self.stdout.write(f"{output} is current (version {version}).")
            return
        output.write_text(openapi.render(doc), encoding="utf-8")
        self.stdout.write(f"Wrote {output} (version {version}).")
