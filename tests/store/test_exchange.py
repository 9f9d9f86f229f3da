"""Export and import: a run as one JSON Lines file, imported into another site with its
ids, every blob checked against its hash; and replaying an export as a golden test.

The two "sites" are the suite's two databases with a blob storage each: SQLite with
blobs on a file storage, PostgreSQL with blobs on S3 (moto); a run goes each way.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from io import StringIO
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command

from aaa_django.algos import GeneratorCritic
from aaa_django.data import claim, hydrate, is_claimed
from aaa_django.data.files import FileBlobStore
from aaa_django.events import Event
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime import InProcessBus
from aaa_django.runtime.event_types import RUN_STARTED, TOOL_COMPLETED
from aaa_django.site.blobs import StorageBlobStore
from aaa_django.site.engines import build_engine
from aaa_django.store import DjangoEventStore, exchange
from aaa_django.testing.blobstore import SpecBlobStore
from tests.algos.scenarios import reviewed

# transaction=True: the engine on PostgreSQL (PgEventStore) writes on connections of its
# own, outside a test transaction (its rows would outlive the test)
pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)

LYON = {"task": "How many people live in Lyon?"}
#: over the claim threshold below: every model reply, and the requests that quote them
NOTES = "\n\nSources: " + "the 2021 census of INSEE; " * 30
CLAIM_THRESHOLD = 600  # the start (~430 bytes) stays in its event


def critic_model(request):
    """The golden GeneratorCritic's model (a draft, a critique, a revision, an approval),
    each reply long enough to be claim-checked."""
    reply = reviewed(2)(request)
    return text(reply.message.content + NOTES)


@pytest.fixture
def sites(request, settings, tmp_path):
    """{"sqlite": (alias, blob storage alias), "postgres": (...)}: two sites' stores."""
    pg = request.getfixturevalue("pg_alias")
    s3 = request.getfixturevalue("s3_bucket")
    settings.STORAGES = {
        **settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "blobs")},
        },
        "s3": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": s3},
    }
    return {"sqlite": ("default", "files"), "postgres": (pg, "s3")}


def use(settings, storage):
    settings.AAA = {**settings.AAA, "BLOB_STORAGE": storage}
    return StorageBlobStore(alias=storage)


def critic_run(alias, blobs):
    """A GeneratorCritic run (draft, critique, revision, approval), claim-checked."""

    async def go():
        async with build_engine(
            using=alias, bus=InProcessBus(), blobs=blobs, claim_threshold=CLAIM_THRESHOLD
        ) as engine:
            LLMHandler(FakeLLMClient(critic_model)).attach(engine)
            run = await engine.start(GeneratorCritic(max_iterations=3), LYON)
            assert (await run.result(timeout=120)).ok  # a hang guard
            await engine.drain(30)
            return run.run_id

    return async_to_sync(go)()


def export_file(run_id, path, *options, database="default"):
    call_command("aaa_export", run_id, "-o", str(path), "--database", database, *options, stderr=StringIO())
    return path


def log_of(alias, run_id):
    return DjangoEventStore(alias).read_sync(run_id)


@pytest.mark.parametrize("source, target", [("sqlite", "postgres"), ("postgres", "sqlite")])
def test_a_run_moves_to_another_site_with_its_ids_and_blobs(
    sites, settings, tmp_path, source, target, django_user_model
):
    (src, src_storage), (dst, dst_storage) = sites[source], sites[target]
    run_id = critic_run(src, use(settings, src_storage))
    sent = log_of(src, run_id)
    assert any(is_claimed(e.data) for e in sent)
    path = export_file(run_id, tmp_path / "run.jsonl", database=src)

    blobs = use(settings, dst_storage)
    django_user_model.objects.db_manager(dst).create_user("alice")
    call_command("aaa_import", str(path), "--database", dst, "--owner", "alice", stdout=StringIO())

    got = log_of(dst, run_id)
    assert [e.to_dict() for e in got[1:]] == [e.to_dict() for e in sent[1:]]
    assert got[0].id == sent[0].id and got[0].data["owner"] != sent[0].data["owner"]
    for e in got:
        for ref in e.blobs:
            assert blobs.get(ref)  # stored on this site's storage, verified
    row = RunRecord.objects.using(dst).get(pk=run_id)
    assert (row.outcome, row.owner.username, row.last_seq) == ("success", "alice", len(sent))


def test_blobs_beside_the_file_travel_with_it(sites, settings, tmp_path):
    (src, files), (dst, s3) = sites["sqlite"], sites["postgres"]
    run_id = critic_run(src, use(settings, files))
    path = export_file(run_id, tmp_path / "run.jsonl", "--blobs", "beside")
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["blobs"] == "beside" and not any('"blob"' in line for line in lines)
    beside = tmp_path / "run.jsonl.blobs"
    assert sorted(p.name for p in beside.iterdir()) == sorted({r.sha256 for e in log_of(src, run_id) for r in e.blobs})

    use(settings, s3)
    call_command("aaa_import", str(path), "--database", dst, stdout=StringIO())
    assert len(log_of(dst, run_id)) == len(lines) - 1


def tampered(path: Path, out: Path) -> Path:
    """The export with one byte of its first blob changed (its base64 still valid)."""
    lines = path.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith('{"blob"'))
    blob = json.loads(lines[i])
    data = bytearray(base64.b64decode(blob["base64"]))
    data[0] ^= 1
    blob["base64"] = base64.b64encode(bytes(data)).decode()
    lines[i] = json.dumps(blob)
    out.write_text("\n".join(lines) + "\n")
    return out


def test_an_import_checks_everything_before_it_writes_anything(sites, settings, tmp_path):
    (src, files), (dst, s3) = sites["sqlite"], sites["postgres"]
    run_id = critic_run(src, use(settings, files))
    good = export_file(run_id, tmp_path / "run.jsonl")
    blobs = use(settings, s3)
    lines = good.read_text().splitlines()
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text("\n".join(lines[:-3]) + "\n")
    no_start = tmp_path / "no_start.jsonl"
    no_start.write_text(
        "\n".join(
            [
                lines[0].replace(f'"events":{len(log_of(src, run_id))}', f'"events":{len(log_of(src, run_id)) - 1}'),
                *lines[2:],
            ]
        )
        + "\n"
    )

    for bad, why in [
        (tampered(good, tmp_path / "tampered.jsonl"), "does not match its hash"),
        (truncated, "truncated"),
        (no_start, "starts with aaa.run.started"),
    ]:
        with pytest.raises(CommandError, match=why):
            call_command("aaa_import", str(bad), "--database", dst, stdout=StringIO())
        assert not EventRecord.objects.using(dst).filter(stream=run_id).exists()
        assert blobs.list(run_id) == []

    call_command("aaa_import", str(good), "--database", dst, stdout=StringIO())
    with pytest.raises(CommandError, match="exists on this site already"):
        call_command("aaa_import", str(good), "--database", dst, stdout=StringIO())
    assert len(log_of(dst, run_id)) == len(log_of(src, run_id))


def test_an_event_id_taken_on_the_target_site_is_a_conflict(sites, settings, tmp_path):
    (src, files) = sites["sqlite"]
    run_id = critic_run(src, use(settings, files))
    export = exchange.read_export(export_file(run_id, tmp_path / "r.jsonl").open())
    # The same events under another run id, their blobs still the first run's: refused,
    # naming a blob (an import never shares another run's blob).
    renamed = exchange.RunExport(
        "run-other", [replace(e, stream="run-other") for e in export.events], export.blobs, export.mode
    )
    assert export.refs()
    with pytest.raises(exchange.ExchangeError, match=f"blob {run_id}/[0-9a-f]{{64}} is outside"):
        exchange.import_run(renamed, using=src, blobs=StorageBlobStore(alias=files))
    # ... and with its blobs in its own namespace: the run is new, its event ids are not.
    moved = {k: replace(ref, namespace="run-other") for k, ref in export.refs().items()}
    renamed = exchange.RunExport(
        "run-other",
        [replace(e, stream="run-other", blobs=tuple(moved[r.key] for r in e.blobs)) for e in export.events],
        {moved[k].key: data for k, data in export.blobs.items()},
        export.mode,
    )
    with pytest.raises(exchange.ExchangeConflict, match="event ids exist"):
        exchange.import_run(renamed, using=src, blobs=StorageBlobStore(alias=files))
    assert not EventRecord.objects.using(src).filter(stream="run-other").exists()


def test_an_exported_production_run_replays_as_a_golden_test(sites, settings, tmp_path, monkeypatch):
    (alias, storage) = sites["postgres"]
    run_id = critic_run(alias, use(settings, storage))
    path = export_file(run_id, tmp_path / "prod.jsonl", database=alias)

    out = StringIO()
    call_command("aaa_replay", str(path), stdout=out)
    assert "all the same as recorded" in out.getvalue()

    from aaa_django.algos import refine

    monkeypatch.setattr(refine, "REVISE", "Please improve it:\n{feedback}")
    out = StringIO()
    with pytest.raises(CommandError, match="first difference at event") as caught:
        call_command("aaa_replay", str(path), stdout=out)
    # The tag is a hot field: a claim-checked request keeps it in the event.
    revision = next(
        e for e in log_of(alias, run_id) if e.type == "aaa.llm.requested" and e.data.get("tag") == "generate-2"
    )
    assert f"event {revision.seq}" in str(caught.value)
    assert "Please improve it" in out.getvalue() and "messages" in out.getvalue()


REPORT = {"call_id": "c1", "name": "fetch_report", "result": "lorem ipsum " * 100}


def exported(run_id, blobs):
    """The export of a run with one claim-checked tool result, its blobs in ``blobs``."""
    stub, ref = claim(REPORT, store=blobs, namespace=run_id, threshold=0)
    events = [
        replace(Event.new(run_id, RUN_STARTED, {"algorithm": "tests.Algo", "input": {}}), seq=1),
        replace(Event.new(run_id, TOOL_COMPLETED, stub, blobs=[ref]), seq=2),
    ]
    return exchange.read_export(exchange.export_lines(run_id, events, len(events), blob=blobs.get))


def test_a_blob_store_with_only_the_four_methods_takes_the_runs_of_a_site_like_it(tmp_path):
    plain = SpecBlobStore()
    exchange.import_run(exported("run-plain", SpecBlobStore()), blobs=plain)

    got = log_of("default", "run-plain")
    assert hydrate(got[-1].data, got[-1].blobs[-1], store=plain) == REPORT

    # A run whose blobs are in namespaces: the events' refs name what this store cannot
    # keep; refused before anything is written.
    with pytest.raises(exchange.ExchangeError, match="keeps none"):
        exchange.import_run(exported("run-spaced", FileBlobStore(tmp_path)), blobs=plain)
    assert not EventRecord.objects.filter(stream="run-spaced").exists()
    assert len(plain.blobs) == 1
