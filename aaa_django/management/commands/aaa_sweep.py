"""Fire due timers, adopt and re-drive runs: ``python manage.py aaa_sweep [--stall-after S] [--dry-run]``.

Fires the deadlines and approval expiries that have come due, adopts the runs whose
holder is gone (a lease that lapsed, a process of this machine that has ended; not in
a dry run), then finds the runs that have started, not completed, had no new event
for ``--stall-after`` seconds (default ``AAA["STALL_AFTER"]``) and no live delivery
(on the in-process bus: no live process holds them), and delivers their events again
(see :mod:`aaa_django.celery.sweeper`). Its engine is wired as the web process's and
the workers' are (:func:`~aaa_django.site.engines.attach_site_handlers`: the site's
model client, tools, MCP servers, agents and ``WORKER_SETUP``). With ``AAA["BUS"] =
"celery"`` the deliveries are enqueued for the workers; with the in-process bus they
run here, the command holding the runs' leases, until the runs end or ``--wait``
seconds pass (on a terminal, a progress bar on stderr counts them ending); the runs
still going then are released, and a web process adopts them.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand, CommandParser

from aaa_django.celery.sweeper import SweepReport, sweep
from aaa_django.conf import aaa_settings
from aaa_django.management.progress import Progress
from aaa_django.runtime import Engine
from aaa_django.site.engines import attach_site_handlers, build_engine
from aaa_django.site.holding import Claims, RunKeeper
from aaa_django.site.host import HostBus


class Command(BaseCommand):
    help = "Find runs nothing is working on any more and deliver their events again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--stall-after", type=float, default=None, help="seconds without a new event (default: AAA['STALL_AFTER'])"
        )
        parser.add_argument("--database", default="default", help="the database alias of the log")
        parser.add_argument("--dry-run", action="store_true", help="list the runs, re-drive nothing")
        parser.add_argument("--limit", type=int, default=1000, help="re-drive at most this many runs")
        parser.add_argument(
            "--wait", type=float, default=60.0, help="in-process bus: seconds to wait for the re-driven runs"
        )

    def handle(
        self,
        *args: object,
        stall_after: float | None,
        database: str,
        dry_run: bool,
        limit: int,
        wait: float,
        **options: object,
    ) -> None:
        report = async_to_sync(self._sweep)(stall_after, database, dry_run, limit, wait)
        verb = "would re-drive" if dry_run else "re-drove"
        self.stdout.write(
            f"{report.unfinished} unfinished runs: {len(report.active)} active, "
            f"{len(report.busy)} busy, {len(report.waiting)} waiting for a person, "
            f"{len(report.recent)} re-driven lately (left to move), "
            f"{verb} {len(report.redriven)}; {len(report.fired)} had a due time fired; "
            f"{len(report.adopted)} adopted from a holder that was gone"
        )
        for run_id in [*report.adopted, *report.redriven]:
            self.stdout.write(f"  {run_id}")

    async def _ended(self, engine: Engine, run_ids: list[str], bar: Progress) -> None:
        for ended in asyncio.as_completed([engine.wait(r) for r in run_ids]):
            await ended
            bar.advance()

    async def _sweep(
        self, stall_after: float | None, database: str, dry_run: bool, limit: int, wait: float
    ) -> SweepReport:
        keeper = RunKeeper(database, name="sweep")
        try:
            if aaa_settings()["BUS"] == "celery":
                from aaa_django.celery.bus import DistributedBus

                async with attach_site_handlers(build_engine(using=database, bus=DistributedBus())) as engine:
                    # (the workers claim what they are sent: the command lets its leases go)
                    report = await sweep(engine, stall_after=stall_after, dry_run=dry_run, limit=limit, keeper=keeper)
                    await keeper.stop(release=True)
                    return report
            engine = build_engine(using=database, bus=HostBus(keeper))
            engine.observe(Claims(keeper))
            async with attach_site_handlers(engine):
                keeper.start(on_regained=lambda runs: engine.resume(sorted(runs - keeper.fenced.keys())))
                try:
                    report = await sweep(engine, stall_after=stall_after, dry_run=dry_run, limit=limit, keeper=keeper)
                    going = [] if dry_run else [*report.adopted, *report.redriven]
                    if going:
                        with Progress("re-driven runs ended", total=len(going), stream=self.stderr) as bar:
                            try:
                                await asyncio.wait_for(self._ended(engine, going, bar), wait)
                            except TimeoutError:
                                bar.close()
                                self.stderr.write(f"some re-driven runs were still going after {wait} s")
                finally:
                    # what is still going is adopted by a web process at once
                    await keeper.stop(release=True)
                return report
        finally:
            await asyncio.to_thread(keeper.close)
