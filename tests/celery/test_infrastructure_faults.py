"""An infrastructure failure inside a worker's handler: a tool's result too big to keep
in its event goes to the blob store, whose S3 bucket is missing. The run ends
``failed`` naming the cause (not ``timeout`` at its deadline), and the worker says so.

The tool call is handed off (its task returned once the call started: Celery's view
of that task is the step and the hand-off, which did succeed), so what fails after it
is the worker loop's to retry or give up on (``WorkerRuntime._carry``), and its log
is where the failure is told, naming the run and the cause."""

from __future__ import annotations

import json
import time

from aaa_django.runtime.event_types import RUN_COMPLETED, TOOL_COMPLETED, TOOL_REQUESTED
from aaa_django.site.blobs import StorageBlobStore

from .conftest import CELERY_DB, make_engine
from .site import loop, script

pytestmark = [CELERY_DB]


def test_a_missing_bucket_fails_the_run_and_the_task(new_cluster, arun, s3_bucket):
    from storages.backends.s3 import S3Storage

    gone = {**s3_bucket, "bucket_name": s3_bucket["bucket_name"] + "-gone"}
    workers = new_cluster(1, suffix="-s3", env={"AAA_TEST_WORKER_S3": json.dumps(gone)})
    task = script(turns=2, tool="big")

    async def main():
        async with make_engine(workers.queues, blobs=StorageBlobStore(S3Storage(**gone))) as engine:
            run = await engine.start(loop(), {"task": task}, deadline=300)
            return await run.result(timeout=60), await run.events()

    outcome, events = arun(main())

    assert outcome.outcome == "failed"  # now, not `timeout` five minutes later
    assert outcome.value["error"].startswith("the blob store failed: BlobStoreUnavailable: NoSuchBucket")
    assert (outcome.value["event_type"], outcome.value["transient"]) == (TOOL_REQUESTED, False)
    assert [e.type for e in events].count(RUN_COMPLETED) == 1 and events[-1].type == RUN_COMPLETED
    assert TOOL_COMPLETED not in [e.type for e in events]
    # The worker's own line, written once the run's end is stored (the run's end is
    # what the test waited for; the line follows it at once, on the same loop)
    said = f"run {events[0].stream} failed: delivering seq"
    end = time.monotonic() + 15
    while not any(said in line and "BlobStoreUnavailable: NoSuchBucket" in line for line in workers.errors()):
        assert time.monotonic() < end, workers.logs()
        time.sleep(0.05)
