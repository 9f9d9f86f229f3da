"""Import a run: ``python manage.py aaa_import FILE [--owner USER] [--blobs DIR]``.

Reads an export (``aaa_export``, the API, the admin), checks it (every blob against
its hash) and stores the run with its ids, owned by ``--owner`` (a username) or
nobody. Nothing is written when anything is wrong. The run is not driven: an unfinished
one waits until something re-drives it (``aaa_sweep``, ``engine.resume``).
"""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from aaa_django.site.engines import site_blobs
from aaa_django.store.exchange import ExchangeError, blob_dir, import_run, read_export


class Command(BaseCommand):
    help = "Store a run from an export file, keeping its ids; its blobs are verified."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")
        parser.add_argument("--owner", help="the username that owns the run here (default: nobody)")
        parser.add_argument("--blobs", help="the blob directory of a 'beside' export (default: FILE.blobs/)")
        parser.add_argument("--database", default="default", help="the database alias of the log")

    def handle(
        self, *args: object, file: str, owner: str | None, blobs: str | None, database: str, **options: object
    ) -> None:
        path = Path(file)
        owner_pk = None
        if owner:
            User = get_user_model()
            try:
                owner_pk = str(User._default_manager.db_manager(database).get_by_natural_key(owner).pk)
            except User.DoesNotExist:
                raise CommandError(f"no user {owner!r}") from None
        try:
            with open(path, encoding="utf-8") as f:
                export = read_export(f, beside=Path(blobs) if blobs else blob_dir(path))
            events = import_run(export, using=database, blobs=site_blobs(), owner=owner_pk)
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        except ExchangeError as exc:
            raise CommandError(f"nothing imported: {exc}") from None
        self.stdout.write(f"imported run {export.run_id}: {len(events)} events, {len(export.refs())} blobs")
