"""Apply the retention policy: ``python manage.py aaa_retain [--dry-run]``.

Erases the ended runs ``AAA["RETENTION"]`` says are due (with their child runs,
snapshots and blobs) and removes orphaned blobs older than ``AAA["ORPHAN_GRACE"]``
(see :mod:`aaa_django.site.retention`). ``--dry-run`` prints what it would erase and erases
nothing. On a terminal, a progress bar on stderr counts the runs as they go.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from aaa_django.management.progress import Progress
from aaa_django.site.retention import Policy, retain


class Command(BaseCommand):
    help = "Erase ended runs past their retention, and blobs no event refers to."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="print what would be erased; erase nothing")
        parser.add_argument("--database", default="default", help="the database alias of the log")
        parser.add_argument("--limit", type=int, default=None, help="erase at most this many run trees in this pass")
        parser.add_argument("--no-orphans", action="store_true", help="skip the orphan-blob sweep")
        parser.add_argument(
            "--grace",
            type=float,
            default=None,
            help="seconds an orphaned blob must be old (default: AAA['ORPHAN_GRACE'])",
        )
        parser.add_argument(
            "--no-vacuum", action="store_true", help="PostgreSQL: do not VACUUM (ANALYZE) the tables afterwards"
        )

    def handle(
        self,
        *args: object,
        dry_run: bool,
        database: str,
        limit: int | None,
        no_orphans: bool,
        grace: float | None,
        no_vacuum: bool,
        **options: object,
    ) -> None:
        if limit is not None and limit < 1:
            raise CommandError("--limit must be at least 1")
        if grace is not None and grace < 0:
            raise CommandError("--grace must be >= 0")
        policy = Policy.from_settings()
        if not policy:
            self.stdout.write("AAA['RETENTION'] keeps every run: no run is due.")
        label = "runs due" if dry_run else "runs erased"
        with Progress(label, stream=self.stderr) as bar:  # a count, on a terminal only
            report = retain(
                database,
                dry_run=dry_run,
                limit=limit,
                orphans=not no_orphans,
                grace=grace,
                vacuum=not no_vacuum,
                progress=bar,
            )
        verb = "would erase" if dry_run else "erased"
        self.stdout.write(f"{verb} {len(report.runs)} runs ({report.events} events)")
        for run_id in report.runs:
            self.stdout.write(f"  run {run_id}")
        if report.held:
            self.stdout.write(f"kept {len(report.held)} due runs: a run of their tree has not ended")
            for run_id in report.held:
                self.stdout.write(f"  held {run_id}")
        if not no_orphans:
            self.stdout.write(f"{verb} {len(report.orphans)} orphaned blobs")
            for namespace, sha in report.orphans:
                self.stdout.write(f"  blob {namespace}/{sha}")
        if report.vacuumed:
            self.stdout.write("vacuumed aaa_event, aaa_snapshot, aaa_run")
