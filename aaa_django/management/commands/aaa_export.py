"""Export a run: ``python manage.py aaa_export RUN_ID [-o FILE] [--blobs inline|beside|none]``.

Writes the run's log as JSON Lines (see :mod:`aaa_django.store.exchange`): to ``FILE`` or
standard output, its blobs inlined (default), in ``FILE.blobs/`` (``beside``) or left
out (``none``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from aaa_django.site.engines import site_blobs
from aaa_django.store.exchange import ExchangeError, blob_dir, export_run


class Command(BaseCommand):
    help = "Write a run's log (and its blobs) as one JSON Lines file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("-o", "--output", help="the file (default: standard output)")
        parser.add_argument(
            "--blobs",
            choices=("inline", "beside", "none"),
            default="inline",
            help="inline (default), beside the file (FILE.blobs/), or none",
        )
        parser.add_argument("--database", default="default", help="the database alias of the log")

    def handle(
        self, *args: object, run_id: str, output: str | None, blobs: str, database: str, **options: object
    ) -> None:
        if blobs == "beside" and not output:
            raise CommandError("--blobs beside needs --output FILE (the blobs go to FILE.blobs/)")
        path = Path(output) if output else None
        try:
            lines = export_run(
                run_id,
                using=database,
                blobs=site_blobs(),
                mode=blobs,
                beside=blob_dir(path) if path and blobs == "beside" else None,
            )
            if path is None:
                for line in lines:
                    self.stdout.write(line, ending="")
                return
            tmp = path.with_name(path.name + ".part")
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(lines)
            tmp.replace(path)  # a reader never sees half a file
        except ExchangeError as exc:
            raise CommandError(str(exc)) from None
        sys.stderr.write(f"run {run_id} exported to {path}\n")
