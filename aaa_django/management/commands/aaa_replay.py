"""Replay an exported run through the current code: ``python manage.py aaa_replay FILE``.

A production run becomes a golden test: the recorded model and tool results are fed
to the algorithm as it is now (:mod:`aaa_django.runtime.replay`), and the command
reports the first event where it decides otherwise than the recording (exit status
1), or that every decision is the same (0). Algorithms of the site are found through
``AAA["WORKER_SETUP"]``'s module, or ``--import MODULE``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand, CommandError, CommandParser

import aaa_django.algos  # noqa: F401  (the built-in algorithms)
from aaa_django.conf import aaa_settings
from aaa_django.runtime.replay import replay
from aaa_django.store.exchange import ExchangeError, blob_dir, read_export


class Command(BaseCommand):
    help = "Replay an exported run through the current algorithm code; report the first difference."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")
        parser.add_argument("--blobs", help="the blob directory of a 'beside' export (default: FILE.blobs/)")
        parser.add_argument(
            "--import",
            dest="modules",
            action="append",
            default=[],
            help="a module that registers algorithms (repeatable)",
        )

    def handle(self, *args: object, file: str, blobs: str | None, modules: list[str], **options: object) -> None:
        setup = aaa_settings().get("WORKER_SETUP")
        for module in [*([setup.rpartition(".")[0]] if setup else []), *modules]:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise CommandError(f"cannot import {module}: {exc}") from None
        path = Path(file)
        try:
            with open(path, encoding="utf-8") as f:
                export = read_export(f, beside=Path(blobs) if blobs else blob_dir(path))
            result = async_to_sync(replay)(export.hydrated())
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        except (ExchangeError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        first = result.first_difference()
        if first is None:
            self.stdout.write(f"run {export.run_id}: {len(result.recorded)} decisions, all the same as recorded")
            return
        self.stdout.write(
            f"run {export.run_id}: the decisions differ from the recording\nfirst difference: {first.describe()}"
        )
        raise CommandError(f"run {export.run_id} does not replay: first difference at event {first.seq}", returncode=1)
