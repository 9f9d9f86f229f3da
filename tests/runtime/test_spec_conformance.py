"""Where the specification names an interface, its minimal form works.

- spec 004: a blob store with only ``put(data, media_type)``, ``get``, ``exists`` and
  ``delete`` claim-checks, hydrates and erases (namespaces are an optional capability);
- spec 001: ``InProcessBus`` and ``DistributedBus`` import from ``aaa_django.events``
  (the core still loads no Django nor Celery for it);
- spec 002: ``Projection.load`` folds from a reader that has only ``read()``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from aaa_django.algos import ToolLoop
from aaa_django.events import Event, FoldCache, InMemoryEventStore, Projection
from aaa_django.llm.fake import text, tool_call
from aaa_django.testing.blobstore import SpecBlobStore
from aaa_django.tools import ToolRegistry, tool

from .helpers import arun, make_engine, of_type


@tool
def fetch_report() -> str:
    """Returns a large document."""
    return "lorem ipsum " * 5000  # ~60 KB


def model(request):
    last = request.messages[-1]
    return tool_call("fetch_report") if last.role == "user" else text(f"got {len(last.content)} chars")


def test_a_four_method_blob_store_claim_checks_hydrates_and_erases():
    blobs = SpecBlobStore()
    registry = ToolRegistry([fetch_report])

    async def scenario():
        async with make_engine(model, registry, blobs=blobs, claim_threshold=2_000) as engine:
            runs = [await engine.start(ToolLoop(registry), {"task": "fetch it"}, run_id=f"run-{i}") for i in (1, 2)]
            outcomes = [await run.result(timeout=5) for run in runs]
            stubs = [of_type(await engine.store.read(r.run_id), "aaa.tool.completed")[0] for r in runs]
            full = await engine.hydrate(stubs[0])
            claimed = len(blobs.blobs)  # the same payloads in two runs: each run's own blobs
            await engine.erase("run-1")
            kept = await engine.hydrate(stubs[1])  # erasing run-1 left run-2's blobs alone
            return outcomes, stubs, full, kept, claimed

    outcomes, stubs, full, kept, claimed = arun(scenario())
    assert [o.value["text"] for o in outcomes] == ["got 60000 chars"] * 2
    assert sorted(stubs[0].data) == ["$claim", "call_id", "name"]
    assert full.data["result"] == kept.data["result"] == "lorem ipsum " * 5000
    assert stubs[0].blobs[-1] != stubs[1].blobs[-1]
    assert claimed >= 2 and len(blobs.blobs) == claimed // 2
    assert not blobs.exists(stubs[0].blobs[-1]) and blobs.exists(stubs[1].blobs[-1])


def test_the_buses_import_from_events_as_spec_001_lists_them():
    from aaa_django.celery.bus import DistributedBus as celery_bus
    from aaa_django.events import DistributedBus, InProcessBus
    from aaa_django.runtime import InProcessBus as in_process

    assert InProcessBus is in_process and DistributedBus is celery_bus


def test_importing_the_in_process_bus_from_events_loads_no_django_nor_celery():
    code = (
        "import sys\n"
        "from aaa_django.events import InProcessBus, Event\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'django', 'celery', 'kombu'})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert json.loads(out) == []


class ReadOnly:
    """A store-agnostic reader (spec 002): ``read()``, nothing else."""

    def __init__(self, store) -> None:
        self._store = store

    async def read(self, stream, *, after=0, limit=None, tenant=None):
        return await self._store.read(stream, after=after, limit=limit, tenant=tenant)


COUNT = Projection(lambda: 0, lambda n, e: n + 1, name="test.count", version=1, state_type=int, every=2)


def test_projection_load_works_with_a_reader_that_only_reads():
    async def scenario():
        store = InMemoryEventStore()
        await store.append([Event.new("s", "test.happened", {"i": i}) for i in range(5)])
        reader = ReadOnly(store)
        return (
            await COUNT.load(reader, "s"),
            await COUNT.load(reader, "s", cache=FoldCache()),
            await COUNT.load(reader, "s", at=3),
            await store.load_snapshot("s", "test.count", 1),
        )

    assert arun(scenario()) == (5, 5, 3, None)  # no snapshot written through a reader
