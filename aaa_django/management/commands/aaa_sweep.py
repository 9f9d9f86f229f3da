"""Fire due timers, re-drive stalled runs: ``python manage.py aaa_sweep [--stall-after S] [--dry-run]``.

Fires the deadlines and approval expiries that have come due (not in a dry run), then
finds the runs that have started, not completed, had no new event for
``--stall-after`` seconds (default ``AAA["STALL_AFTER"]``) and no live delivery, and
delivers their events again (see :mod:`aaa_django.celery.sweeper`). With ``AAA["BUS"] =
"celery"`` the deliveries are enqueued for the workers; with the in-process bus they
run here, with the handlers ``AAA["WORKER_SETUP"]`` attaches, until the runs end or
``--wait`` seconds pass (on a terminal, a progress bar on stderr counts them ending).
"""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand, CommandParser
from django.utils.module_loading import import_string

from aaa_django.celery.sweeper import SweepReport, sweep
from aaa_django.conf import aaa_settings
from aaa_django.management.progress import Progress
from aaa_django.runtime import Engine
from aaa_django.site.engines import build_engine


class Command(BaseCommand):
    help = "Find runs nothing is working on any more and deliver their events again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--stall-after", type=float, default=None,
                            help="seconds without a new event (default: AAA['STALL_AFTER'])")
        parser.add_argument("--database", default="default", help="the database alias of the log")
        parser.add_argument("--dry-run", action="store_true", help="list the runs, re-drive nothing")
        parser.add_argument("--limit", type=int, default=1000, help="re-drive at most this many runs")
        parser.add_argument("--wait", type=float, default=60.0,
                            help="in-process bus: seconds to wait for the re-driven runs")

    def handle(self, *args: Any, stall_after: float | None, database: str, dry_run: bool,
               limit: int, wait: float, **options: Any) -> None:
        report = async_to_sync(self._sweep)(stall_after, database, dry_run, limit, wait)
        verb = "would re-drive" if dry_run else "re-drove"
        self.stdout.write(
            f"{report.unfinished} unfinished runs: {len(report.active)} active, "
            f"{len(report.busy)} busy, {len(report.waiting)} waiting for a person, "
            f"{len(report.recent)} re-driven lately (left to move), "
            f"{verb} {len(report.redriven)}; {len(report.fired)} had a due time fired"
        )
        for run_id in report.redriven:
            self.stdout.write(f"  {run_id}")

    async def _ended(self, engine: Engine, run_ids: list[str], bar: Progress) -> None:
        for ended in asyncio.as_completed([engine.wait(r) for r in run_ids]):
            await ended
            bar.advance()

    async def _sweep(self, stall_after: float | None, database: str, dry_run: bool, limit: int,
                     wait: float) -> SweepReport:
        conf = aaa_settings()
        if conf["BUS"] == "celery":
            from aaa_django.celery.bus import DistributedBus

            async with build_engine(using=database, bus=DistributedBus()) as engine:
                return await sweep(engine, stall_after=stall_after, dry_run=dry_run, limit=limit)
        async with build_engine(using=database) as engine:
            if conf["WORKER_SETUP"]:
                import_string(conf["WORKER_SETUP"])(engine)
            report = await sweep(engine, stall_after=stall_after, dry_run=dry_run, limit=limit)
            if report.redriven and not dry_run:
                with Progress("re-driven runs ended", total=len(report.redriven), stream=self.stderr) as bar:
                    try:
                        await asyncio.wait_for(self._ended(engine, report.redriven, bar), wait)
                    except asyncio.TimeoutError:
                        bar.close()
                        self.stderr.write(f"some re-driven runs were still going after {wait} s")
            return report
