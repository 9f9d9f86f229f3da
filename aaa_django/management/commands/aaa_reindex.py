"""Rebuild the run index (``RunRecord`` rows) from the event log.

    python manage.py aaa_reindex [--run RUN_ID ...] [--database ALIAS]

Each run's row is refolded from its whole log (``RUNMETA`` plus event times); rows
of runs that are no longer in the log are deleted. Safe to run at any time: the
index is derived data. On a terminal, a progress bar on stderr.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandParser

from aaa_django.management.progress import Progress
from aaa_django.store.runindex import reindex


class Command(BaseCommand):
    help = "Rebuild the run index from the event log."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", action="append", dest="runs", default=None, help="only this run (repeatable)")
        parser.add_argument("--database", default="default", help="the database alias")

    def handle(self, *args: object, runs: list[str] | None, database: str, **options: object) -> None:
        with Progress("re-indexing", stream=self.stderr) as bar:  # on a terminal only
            counts = reindex(database, runs, progress=bar)
        self.stdout.write(
            f"Indexed {counts['indexed']} runs; skipped {counts['skipped']} streams that "
            f"are not runs; deleted {counts['deleted']} rows of erased runs."
        )
        if counts["missing"]:  # (named with --run: streams of the log are never empty)
            self.stdout.write(
                f"Not in the log: {counts['missing']} of the runs named (no events: erased, or never started)."
            )
