"""Run leases in the run index (``aaa_django.store.leases``) and a process's keeper of
them (``aaa_django.site.holding``), on SQLite and PostgreSQL: a heartbeat renews every
lease in one statement; a lapsed lease, or one of a process known to be dead, is
adopted once however many processes try; a process that cannot renew stands down at
half the lease and, once it can again, does not take back what was adopted meanwhile."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest
from django.utils import timezone

from aaa_django.models import RunRecord
from aaa_django.site.holding import RunKeeper, holder_id, process_gone
from aaa_django.store.leases import RunLeases

pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)


def runs(alias: str, n: int, *, status: str = "running", prefix: str = "run") -> list[str]:
    now = timezone.now()
    ids = [f"{prefix}-{i}" for i in range(n)]
    RunRecord.objects.using(alias).bulk_create(
        [RunRecord(run_id=r, status=status, started_at=now, updated_at=now) for r in ids]
    )
    return ids


def rows(alias: str) -> dict[str, tuple]:
    return {r.run_id: (r.held_by, r.held_until, r.adoptions) for r in RunRecord.objects.using(alias).all()}


@pytest.fixture
def leases(db_alias):
    made: list[RunLeases] = []

    def make() -> RunLeases:
        made.append(RunLeases(db_alias))
        return made[-1]

    yield make
    for lease in made:
        lease.close()


def test_one_write_renews_every_lease_of_a_holder_and_only_of_unfinished_runs(db_alias, leases):
    """A renewal writes the holder's own row, not its runs' (at 3,000 runs, writing each
    run's row took 126 ms of the database every 1.5 s and held 3,000 row locks that the
    appends waited on); every lease of the holder lives on with it, and only its own."""
    ids = runs(db_alias, 5)
    done = runs(db_alias, 1, status="completed", prefix="done")
    a = leases()
    assert a.claim("A", ids[:3] + done, 0.3) == set(ids[:3])  # a run that has ended is nobody's
    assert a.claim("B", ids[3:], 0.3) == set(ids[3:])
    before = rows(db_alias)
    statements: list[str] = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    a.connection().execute_wrappers.append(count)
    held = a.renew("A", 60)
    a.connection().execute_wrappers.remove(count)
    time.sleep(0.5)  # the claims' 0.3 s have passed

    assert held == set(ids[:3])
    writes = [s for s in statements if not s.lstrip().upper().startswith("SELECT")]
    assert len(writes) == 1 and "aaa_holder" in writes[0]
    assert rows(db_alias) == before  # no run's row written
    assert sorted(a.lapsed()) == [(r, "B") for r in sorted(ids[3:])]  # A's live on, B's lapsed
    ends = a.held(ids)
    assert all(ends[r][1] > time.time() + 50 for r in ids[:3])  # A's: the renewal's 60 s


def test_a_lease_let_go_lapses_at_once_though_its_holder_lives(db_alias, leases):
    ids = runs(db_alias, 2)
    a = leases()
    a.claim("A", ids, 60)
    a.renew("A", 60)
    assert a.release("A", ids[:1]) == {ids[0]}
    assert a.lapsed() == [(ids[0], "A")]
    assert a.release("A") == set(ids)  # all of them (a process shutting down)
    assert sorted(a.lapsed()) == [(r, "A") for r in sorted(ids)]


def test_a_claim_takes_what_nobody_or_a_lapsed_lease_holds_and_force_takes_anything(db_alias, leases):
    ids = runs(db_alias, 3)
    a = leases()
    a.claim("A", ids[:1], 60)
    a.claim("B", ids[1:2], -1)  # lapsed at once

    assert a.claim("C", ids, 60) == {ids[1], ids[2]}  # not A's live one
    assert a.claim("C", ids[:1], 60, force=True) == {ids[0]}  # handed the run's work
    assert {r: h for r, (h, _, _) in rows(db_alias).items()} == dict.fromkeys(ids, "C")


def test_two_processes_adopting_at_once_take_each_lapsed_run_once(db_alias, leases):
    ids = runs(db_alias, 40)
    leases().claim("dead", ids, -1)  # lapsed
    takers = [leases() for _ in range(4)]
    got: dict[int, set[str]] = {}
    start = threading.Barrier(len(takers))

    def adopt(i: int) -> None:
        start.wait()
        got[i] = set()
        for run_id, holder in takers[i].lapsed():
            got[i] |= takers[i].adopt(f"taker-{i}", holder, [run_id], 60)
        takers[i].close()

    threads = [threading.Thread(target=adopt, args=(i,)) for i in range(len(takers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    taken = [r for s in got.values() for r in s]
    assert sorted(taken) == sorted(ids)  # every run once
    final = rows(db_alias)
    assert all(final[r][0] == f"taker-{i}" and final[r][2] == 1 for i, s in got.items() for r in s)


def test_a_live_lease_is_not_adopted_and_the_lapse_is_the_databases_clock(db_alias, leases):
    ids = runs(db_alias, 2)
    a = leases()
    a.claim("A", ids[:1], 30)
    a.claim("B", ids[1:], 0.3)
    assert a.lapsed() == []
    time.sleep(0.5)
    assert a.lapsed() == [(ids[1], "B")]
    assert a.adopt("C", "A", ids[:1], 30) == set()  # A's has not lapsed
    assert a.adopt("C", "B", ids[1:], 30) == {ids[1]}


def ended_holder(name: str) -> str:
    """The holder id a process of this machine had, which has ended since."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    with open(f"/proc/{child.pid}/stat") as f:
        started = f.read().rsplit(")", 1)[-1].split()[19]
    child.communicate(b"")
    parts = holder_id(name).split("|")
    parts[3], parts[4] = str(child.pid), started
    return "|".join(parts)


def test_a_holder_of_this_machine_whose_process_ended_is_known_gone():
    dead = ended_holder("x")
    assert process_gone(dead)
    assert not process_gone(holder_id("me"))  # this process
    other_machine = "|".join(["x", "elsewhere", *dead.split("|")[2:]])
    assert not process_gone(other_machine)  # not known
    reused = dead.split("|")
    reused[3] = str(os.getpid())  # a pid now another process's (another start time)
    assert process_gone("|".join(reused))


def test_a_keeper_adopts_the_runs_of_a_dead_process_at_once(db_alias, leases):
    ids = runs(db_alias, 3)
    dead = ended_holder("web")
    leases().claim(dead, ids, 3600)  # a lease far from lapsing: its holder is gone

    async def main():
        keeper = RunKeeper(db_alias, ttl=6, name="test")
        try:
            return keeper.id, await keeper.adopt(), await keeper.adopt()
        finally:
            await asyncio.to_thread(keeper.close)

    me, first, second = asyncio.run(main())
    assert first == set(ids) and second == set()
    assert {h for h, _, _ in rows(db_alias).values()} == {me}


def test_a_keeper_adopts_only_the_runs_of_its_fleet(db_alias, leases):
    """Two sites (or deployments) that share a database but not their Celery queues are
    two fleets: a keeper takes the lapsed runs and the dead holders' runs of its own
    fleet only, whoever asks first."""
    lapsed = {fleet: runs(db_alias, 2, prefix=f"lapsed-{fleet or 'none'}") for fleet in ("", "q1", "q2")}
    dead = {fleet: runs(db_alias, 1, prefix=f"dead-{fleet or 'none'}") for fleet in ("", "q1", "q2")}
    store = leases()
    for fleet in ("", "q1", "q2"):
        kind = f"worker@{fleet}" if fleet else "worker"
        store.claim(holder_id(kind), lapsed[fleet], 0.2)
        store.claim(ended_holder(kind), dead[fleet], 3600)
    time.sleep(0.4)

    async def main():
        took = {}
        for fleet in ("q2", "", "q1"):
            keeper = RunKeeper(db_alias, ttl=6, name="worker", fleet=fleet)
            try:
                took[fleet] = await keeper.adopt()
            finally:
                await asyncio.to_thread(keeper.close)
        return took

    took = asyncio.run(main())
    assert took == {fleet: {*lapsed[fleet], *dead[fleet]} for fleet in ("", "q1", "q2")}


def test_a_processes_fleet_is_its_celery_queues(settings):
    from aaa_django.site.holding import fleet, fleet_of

    settings.AAA = {"BUS": "celery", "CELERY_QUEUES": {"algorithms": "a-1", "llm": "l-1", "tools": "t-1"}}
    one = fleet()
    settings.AAA = {"BUS": "celery", "CELERY_QUEUES": {"tools": "t-1", "llm": "l-1", "algorithms": "a-1"}}
    assert fleet() == one and len(one) == 12  # the same queues, in any order
    settings.AAA = {"BUS": "celery", "CELERY_QUEUES": {"algorithms": "a-2", "llm": "l-1", "tools": "t-1"}}
    assert fleet() not in (one, "")
    settings.AAA = {"BUS": "celery"}
    assert fleet() == ""  # Celery's default queues: the site's one fleet
    settings.AAA = {"BUS": "inprocess", "CELERY_QUEUES": {"algorithms": "a-1"}}
    assert fleet() == ""
    assert fleet_of(holder_id(f"worker@{one}")) == one
    assert fleet_of(holder_id("web")) == ""


class Unreachable(RunLeases):
    """Leases whose database goes away while ``down`` is set (a partition)."""

    down = False

    def _run(self, sql, params, *, returns=True):
        if self.down:
            from aaa_django.events import StoreUnavailable

            raise StoreUnavailable("cut off", service="database")
        return super()._run(sql, params, returns=returns)


def test_a_keeper_that_cannot_renew_stands_down_at_half_the_lease_and_is_fenced_from_what_was_adopted(db_alias):
    ids = runs(db_alias, 4)
    TTL = 4.0

    async def main():
        keeper = RunKeeper(db_alias, ttl=TTL, name="cut")
        keeper.leases = cut = Unreachable(db_alias)
        other = RunKeeper(db_alias, ttl=TTL, name="other")
        try:
            for r in ids[:3]:
                assert await keeper.claim(r)
            await keeper.beat()
            held_before = {r: keeper.holds(r) for r in ids}
            cut.down = True
            await until(keeper.standing_down)  # half a lease since the last renewal began
            failed = await keeper.beat()
            down = {r: keeper.holds(r) for r in ids}
            # the leases lapse at a full lease (the database's clock)
            end = time.monotonic() + 10 * TTL
            while await asyncio.to_thread(lapsed, db_alias) != set(ids[:3]):
                assert time.monotonic() < end, "the leases never lapsed"
                await asyncio.sleep(0.05)
            adopted = await other.adopt()
            cut.down = False
            back = await keeper.beat()
            return (
                held_before,
                failed,
                down,
                adopted,
                back,
                {r: keeper.holds(r) for r in ids},
                await keeper.claim(ids[3]),
            )
        finally:
            await asyncio.to_thread(keeper.close)
            await asyncio.to_thread(other.close)

    held_before, failed, down, adopted, back, after, claimed = asyncio.run(main())
    assert all(held_before.values())  # (a run not claimed yet: not taken from anyone either)
    assert failed.failed and not any(down.values())  # stood down: no call for any run
    assert adopted == set(ids[:3])  # lapsed, adopted by the other process
    assert back.fenced == set(ids[:3]) and back.held == set()
    assert not any(after[r] for r in ids[:3])  # never called out for again here
    assert after[ids[3]] and claimed  # what nobody took is this process's to take


def lapsed(alias: str) -> set[str]:
    leases = RunLeases(alias)
    try:
        return {r for r, _ in leases.lapsed()}
    finally:
        leases.close()


async def until(check, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.05)


def test_a_keeper_that_regains_its_leases_after_standing_down_drives_them_again(db_alias):
    ids = runs(db_alias, 2)
    TTL = 2.0

    async def main():
        keeper = RunKeeper(db_alias, ttl=TTL, name="slow")
        keeper.leases = cut = Unreachable(db_alias)
        try:
            for r in ids:
                await keeper.claim(r)
            await keeper.beat()
            cut.down = True
            await asyncio.sleep(TTL / 2 + 0.05)  # stood down, not lapsed
            stood_down = keeper.standing_down()
            cut.down = False
            return stood_down, await keeper.beat()
        finally:
            await asyncio.to_thread(keeper.close)

    stood_down, beat = asyncio.run(main())
    assert stood_down
    assert beat.regained == set(ids) and beat.fenced == set()


def test_a_run_declined_while_standing_down_is_driven_again_even_when_a_sibling_took_it(db_alias):
    """A Celery worker's prefork children each claim the runs whose messages they take:
    a run moves between them with every delivery. A child that stood down (its loop
    stalled past half a lease) declined a tool call; meanwhile its sibling took the run
    for another event. Its next renewal finds the run gone and fences it: yet the call
    it skipped is nobody's work unless it is driven again (in CI, two runs of 200 then
    waited for ever for their tool results, tests/celery/test_parallel_results.py)."""
    ids = runs(db_alias, 3)
    TTL = 2.0

    async def main():
        keeper = RunKeeper(db_alias, ttl=TTL, name="child-1")
        sibling = RunKeeper(db_alias, ttl=TTL, name="child-2")
        keeper.leases = cut = Unreachable(db_alias)
        try:
            for r in ids:
                await keeper.claim(r)
            first = await keeper.beat()
            cut.down = True
            await asyncio.sleep(TTL + 0.05)  # stalled: stood down, and its leases lapsed
            declined = [r for r in ids if not keeper.holds(r)]  # a call skipped for each
            await sibling.claim(ids[0])  # a message of ids[0] went to the sibling
            cut.down = False
            back = await keeper.beat()
            after = await keeper.beat()  # (nothing declined since)
            return first, declined, back, after
        finally:
            await asyncio.to_thread(keeper.close)
            await asyncio.to_thread(sibling.close)

    first, declined, back, after = asyncio.run(main())
    assert first.declined == set()
    assert declined == ids
    assert back.fenced == {ids[0]}  # (taken while it stood down: not called out for here)
    # every run whose call was skipped is driven again: those it holds here, and the
    # one the sibling took (a worker sends that one's deliveries to the broker)
    assert back.declined == set(ids)
    assert after.declined == set()
