"""Retention: runs erased by age and outcome with their blobs, never a running one; the
orphan sweep; the command, its dry run and the Celery task. On SQLite and PostgreSQL,
with blobs on a file storage and on S3 (moto)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command

from aaa_django.algos import ToolLoop
from aaa_django.data.keys import namespace_segment
from aaa_django.events import Event
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.models import EventRecord, RunRecord, SnapshotRecord
from aaa_django.runtime import InProcessBus
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED, completion_id, started_id
from aaa_django.site.blobs import StorageBlobStore
from aaa_django.site.engines import build_engine
from aaa_django.site.retention import Policy, apply_retention, retain, sweep_orphans
from aaa_django.store import DjangoEventStore
from aaa_django.tools import ToolHandler, ToolRegistry, tool
from tests.management.test_progress import Terminal, last_line
from tests.runtime import algos as engine_algos  # noqa: F401  (registers tests.parent)

# transaction=True: the engine on PostgreSQL (PgEventStore) writes on connections of its
# own, outside a test transaction (its rows would outlive the test)
pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)

ALIAS = "retention_blobs"
BIG = "x" * 2000  # over the test's claim threshold: a blob


@tool
def fetch() -> str:
    """A big document."""
    return BIG


TOOLS = ToolRegistry([fetch])


def model(request):
    """Fetch the document (a blob), then answer with a big text (a blob too), or fail
    when the task says so."""
    if request.messages[-1].role != "tool":
        return tool_call("fetch")
    if "fail" in request.messages[0].content:
        raise RuntimeError("the model is down")
    return text(BIG)


def use_blobs(request, settings, tmp_path, kind):
    """``AAA["BLOB_STORAGE"]`` on a file storage or an S3 bucket; the store over it."""
    if kind == "files":
        storage = {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "blobs")},
        }
    else:
        storage = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": request.getfixturevalue("s3_bucket")}
    settings.STORAGES = {**settings.STORAGES, ALIAS: storage}
    settings.AAA = {**settings.AAA, "BLOB_STORAGE": ALIAS, "CLAIM_THRESHOLD": 500}
    return StorageBlobStore(alias=ALIAS)


# Each backend and each blob storage at least once, without the whole cross product
# (an S3 round trip to moto costs what a hundred file operations do).
@pytest.fixture(params=[("default", "files"), ("postgres", "s3")], ids=["sqlite-files", "postgres-s3"])
def site(request, settings, tmp_path):
    """(database alias, blob store) of the test's site."""
    alias, kind = request.param
    if alias == "postgres":
        alias = request.getfixturevalue("pg_alias")
    return alias, use_blobs(request, settings, tmp_path, kind)


@pytest.fixture
def blobs(request, settings, tmp_path):
    return use_blobs(request, settings, tmp_path, "files")


def start_runs(alias, *tasks, llm=True, algorithm=None):
    """Start a ToolLoop per task (or ``algorithm``) and let each end; their ids."""

    async def go():
        async with build_engine(using=alias, bus=InProcessBus()) as engine:
            ToolHandler(TOOLS).attach(engine)
            if llm:
                LLMHandler(FakeLLMClient(model)).attach(engine)
            runs = [await engine.start(algorithm or ToolLoop(TOOLS), {"task": t}) for t in tasks]
            if llm:
                for run in runs:
                    await run.result(timeout=120)  # a hang guard (moto is slow on a busy machine)
            await engine.drain(30)
            return [r.run_id for r in runs]

    return async_to_sync(go)()


def later(days):
    return datetime.now(timezone.utc) + timedelta(days=days)


def ended_days_ago(alias, days):
    """Age every ended run: as if they had ended ``days`` ago (the index row is what
    the policy reads; the log itself is checked for the completion)."""
    RunRecord.objects.using(alias).filter(status="completed").update(ended_at=later(-days))


def sweep(alias, **kw):
    async def go():
        async with build_engine(using=alias, bus=InProcessBus()) as engine:
            return await apply_retention(engine, **kw)

    return async_to_sync(go)()


def present(alias, run_ids):
    return set(EventRecord.objects.using(alias).filter(stream__in=run_ids).values_list("stream", flat=True))


POLICY = Policy({"success": 30, "failed": 90})


def test_runs_are_erased_by_outcome_and_age_with_their_blobs(site):
    db_alias, blobs = site
    ok, bad = start_runs(db_alias, "say hi", "fail please")
    (running,) = start_runs(db_alias, "never answered", llm=False)
    assert RunRecord.objects.using(db_alias).get(pk=bad).outcome == "failed"
    assert blobs.list(ok) and blobs.list(bad)  # the document, the requests that show it
    SnapshotRecord.objects.using(db_alias).create(stream=ok, name="x", version=1, seq=1, event_id="e", state="{}")

    young = sweep(db_alias, policy=POLICY, now=later(29))
    month = sweep(db_alias, policy=POLICY, now=later(31))

    assert young.runs == [] and young.events == 0
    assert month.runs == [ok] and month.events > 0
    assert present(db_alias, [ok, bad, running]) == {bad, running}
    assert not RunRecord.objects.using(db_alias).filter(pk=ok).exists()
    assert not SnapshotRecord.objects.using(db_alias).filter(stream=ok).exists()
    assert blobs.list(ok) == [] and blobs.list(bad)

    quarter = sweep(db_alias, policy=POLICY, now=later(91))
    assert quarter.runs == [bad]
    assert blobs.list(bad) == []
    assert present(db_alias, [running]) == {running}  # never a running run


def test_a_run_tree_goes_with_its_root_and_a_running_run_never(site):
    db_alias, blobs = site
    from aaa_django.runtime import registry

    tree = registry.build(
        "tests.parent", {"child": {"algorithm": "aaa.algos.ToolLoop", "config": {"tools": TOOLS.specs()}}}
    )
    (root,) = start_runs(db_alias, "say hi", algorithm=tree)
    (child,) = RunRecord.objects.using(db_alias).filter(parent=root).values_list("pk", flat=True)
    # A finished root whose child never ended (written by hand: the engine would cancel it).
    store = DjangoEventStore(db_alias)
    store.append_sync(
        [
            Event(
                id=started_id("run-held"),
                stream="run-held",
                type=RUN_STARTED,
                data={"algorithm": "aaa.algos.ToolLoop", "input": {"task": "t"}},
            ),
            Event(
                id=completion_id("run-held"),
                stream="run-held",
                type=RUN_COMPLETED,
                data={"outcome": "success", "value": None},
            ),
        ]
    )
    store.append_sync(
        [
            Event(
                id=started_id("run-held-child"),
                stream="run-held-child",
                type=RUN_STARTED,
                data={"algorithm": "aaa.algos.ToolLoop", "input": {"task": "t"}, "parent": "run-held"},
            )
        ]
    )

    report = sweep(db_alias, policy=Policy({"*": 1}), now=later(2))

    assert report.runs == [root, child]
    assert report.held == ["run-held"]
    assert present(db_alias, [root, child, "run-held", "run-held-child"]) == {"run-held", "run-held-child"}
    assert blobs.list(child) == []


def test_the_dry_run_lists_and_erases_nothing(site):
    db_alias, blobs = site
    runs = start_runs(db_alias, "one", "two", "three")
    blobs.put(b"lost", namespace="run-gone")

    report = sweep(db_alias, policy=Policy({"success": 1}), now=later(2), dry_run=True, batch=2)

    assert report.dry_run and sorted(report.runs) == sorted(runs) and report.events > 0
    assert report.orphans == [("run-gone", blobs.list("run-gone")[0].sha256)]
    assert present(db_alias, runs) == set(runs)
    assert all(blobs.list(r) for r in runs) and blobs.list("run-gone")


def test_the_orphan_sweep_removes_blobs_no_event_refers_to(site):
    db_alias, blobs = site
    kept, crashed = start_runs(db_alias, "kept", "crashed")
    referenced = blobs.list(kept)
    stray = blobs.put(b'{"never": "appended"}', "application/json", namespace=kept)
    long_name = "run-" + "y" * 300  # stored under a hashed segment
    lost = blobs.put(b"lost", namespace=long_name)
    # A crash between erasing a log and its blobs: the blobs stay behind.
    DjangoEventStore(db_alias).erase_sync(crashed)
    left_behind = blobs.list(crashed)
    assert left_behind

    async def orphans(**kw):
        async with build_engine(using=db_alias, bus=InProcessBus()) as engine:
            return await sweep_orphans(engine, **kw)

    assert async_to_sync(orphans)() == []  # all younger than ORPHAN_GRACE (a day)
    found = async_to_sync(orphans)(now=later(2))

    assert sorted(found) == sorted(
        [(kept, stray.sha256), (namespace_segment(long_name), lost.sha256), *[(crashed, r.sha256) for r in left_behind]]
    )
    assert blobs.list(kept) == referenced
    assert blobs.list(crashed) == [] and blobs.list(long_name) == []
    assert async_to_sync(orphans)(now=later(2)) == []


def test_the_command_prints_what_it_would_erase_then_erases_it(blobs, settings):
    db_alias = "default"
    settings.AAA = {**settings.AAA, "RETENTION": {"success": 30}}
    (run,) = start_runs(db_alias, "hi")
    ended_days_ago(db_alias, 31)
    out = StringIO()

    tty = Terminal()
    call_command("aaa_retain", "--dry-run", "--no-orphans", stdout=out, stderr=tty)

    assert "would erase 1 runs" in out.getvalue() and f"  run {run}" in out.getvalue()
    assert last_line(tty.getvalue()) == "runs due 1"  # the progress, on a terminal
    assert present(db_alias, [run]) == {run}
    tty, pipe = Terminal(), StringIO()
    call_command("aaa_retain", "--no-orphans", stdout=StringIO(), stderr=tty)
    assert present(db_alias, [run]) == set()
    assert last_line(tty.getvalue()) == "runs erased 1"
    call_command("aaa_retain", "--no-orphans", stdout=StringIO(), stderr=pipe)
    assert pipe.getvalue() == ""  # nowhere else


def test_the_celery_task_applies_the_settings_policy(blobs, settings):
    db_alias = "default"
    from aaa_django.tasks import retain as task

    settings.AAA = {**settings.AAA, "RETENTION": {"*": 1}}
    runs = start_runs(db_alias, "a", "fail b")
    ended_days_ago(db_alias, 2)

    summary = task.apply(kwargs={"dry_run": True}).get()
    assert summary["runs"] == 2 and present(db_alias, runs) == set(runs)
    summary = task.apply().get()
    assert summary["runs"] == 2 and present(db_alias, runs) == set()


def test_a_policy_keeps_what_it_does_not_name():
    p = Policy({"failed": 90, "success": None})
    assert p.keep("failed") == timedelta(days=90)
    assert p.keep("success") is None and p.keep("cancelled") is None
    assert Policy({"*": 7, "failed": 90}).keep("timeout") == timedelta(days=7)
    assert not Policy() and not Policy({"success": None})


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_postgresql_is_vacuumed_after_a_sweep(pg_alias, settings):
    settings.AAA = {**settings.AAA, "BLOB_STORAGE": None}
    start_runs(pg_alias, "a")

    report = retain(pg_alias, policy=Policy({"*": 1}), now=later(2))

    assert report.runs and report.vacuumed
    from django.db import connections

    with connections[pg_alias].cursor() as cur:
        cur.execute("SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'aaa_event'")
        assert cur.fetchone() == (True,)
