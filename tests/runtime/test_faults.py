"""A failure that is not the algorithm's (a store's outage, a blob store that refuses, a
handler's bug) never leaves a run hanging until its deadline: the in-process bus
delivers again after a transient one, with the delays its policy chose, and a
persistent one (or an outage that outlasts the retries) ends the run ``failed``
with a reason that names the cause.

The stores here raise the core's own errors, as the Django adapters translate their
drivers' (tests/store/test_faults_django.py shows that translation on real services).
"""

from __future__ import annotations

from aaa_django.algos import ToolLoop
from aaa_django.data import BlobStoreUnavailable, InMemoryBlobStore
from aaa_django.events import Event, InMemoryEventStore, StoreUnavailable
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Backoff, InProcessBus, Redelivery
from aaa_django.tools import ToolRegistry, tool

from . import algos  # noqa: F401  (registers tests.reader)
from .helpers import arun, make_engine, of_type, tool_messages

#: three retries, doubling from 0.1 s, no jitter: the delays are known in advance
POLICY = Redelivery(retries=3, backoff=Backoff(initial=0.1, max=1.0, jitter=0))


def recording_bus() -> tuple[InProcessBus, list[float]]:
    """A bus that records the delays it would wait before each redelivery."""
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    return InProcessBus(redelivery=POLICY, sleep=sleep), waited


class Flaky:
    """A store whose reads fail while ``failures`` lasts (a delivery of another
    process's event reads the log first: the engine's tail does not hold it)."""

    def __init__(self, inner, failures: int) -> None:
        self.inner, self.cache_key, self.failures = inner, inner.cache_key, failures

    async def read(self, stream, **kw):
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("OperationalError: the connection is lost")
        return await self.inner.read(stream, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def reader_run(failures: int):
    """tests.reader, whose step on ``tests.go.given`` reads the whole log, with the
    store failing that read ``failures`` times. The event is another process's (the
    engine's tail does not hold it: the step must read the log to catch up)."""

    async def scenario():
        store = InMemoryEventStore()
        flaky = Flaky(store, 0)
        bus, waited = recording_bus()
        async with make_engine(store=flaky, bus=bus) as engine:
            run = await engine.start("tests.reader", {}, run_id="run-f")
            await engine.drain(5)  # started, validated: the engine's own view is warm
            flaky.failures = failures
            go = await store.append([Event(id="go", stream="run-f", type="tests.go.given")])
            await engine.bus.publish(go)  # delivered here
            outcome = await run.result(timeout=5)
            await engine.drain(5)
            return outcome, waited, bus, engine

    return arun(scenario())


def test_a_store_outage_in_a_step_is_delivered_again_until_the_store_is_back():
    outcome, waited, bus, engine = reader_run(failures=2)
    assert outcome.ok and outcome.value == {"events": 3}
    assert waited == [0.1, 0.2]  # the policy's backoff, recorded, not slept
    assert [(r[0], r[1]) for r in bus.retried] == [("go", 1), ("go", 2)]
    assert all(isinstance(r[3], StoreUnavailable) for r in bus.retried)
    assert bus.errors == [] and engine.errors == []


def test_an_outage_that_outlasts_the_retries_ends_the_run_failed_naming_it():
    # every delivery's read fails (the first and three retries); the store answers again
    # when the bus gives up, so the run's failure can be recorded
    outcome, waited, bus, engine = reader_run(failures=POLICY.retries + 1)
    assert outcome.outcome == "failed"
    assert waited == [0.1, 0.2, 0.4]  # three retries, then it gives up
    v = outcome.value
    assert v["error"] == ("the event store failed: StoreUnavailable: OperationalError: the connection is lost")
    assert (v["service"], v["transient"], v["attempts"]) == ("event store", True, 4)
    assert (v["event"], v["event_type"]) == ("go", "tests.go.given")
    assert len(bus.errors) == 1 and isinstance(bus.errors[0], StoreUnavailable)
    assert engine.errors == []  # not a handler's bug


@tool
def big(n: int) -> str:
    """Returns n characters."""
    return "y" * n


def big_then_answer(request):
    return tool_call("big", n=50_000) if tool_messages(request) == 0 else text("done")


class RefusingBlobs(InMemoryBlobStore):
    """A blob store whose every put fails as S3 does when its bucket is missing."""

    def __init__(self, transient: bool) -> None:
        super().__init__()
        self.transient = transient
        self.puts = 0

    def put(self, *args, **kwargs):
        self.puts += 1
        raise BlobStoreUnavailable(
            "ClientError: An error occurred (NoSuchBucket) when calling the PutObject "
            "operation: The specified bucket does not exist",
            transient=self.transient,
        )


def big_tool_run(blobs):
    async def scenario():
        bus, waited = recording_bus()
        async with make_engine(
            big_then_answer, ToolRegistry([big]), blobs=blobs, bus=bus, claim_threshold=16_384
        ) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([big])), {"task": "big"}, run_id="run-b", deadline=60)
            outcome = await run.result(timeout=5)
            await engine.drain(5)
            return outcome, waited, bus, await engine.store.read("run-b")

    return arun(scenario())


def test_a_blob_store_that_refuses_a_big_tool_result_fails_the_run_at_once():
    blobs = RefusingBlobs(transient=False)
    outcome, waited, bus, log = big_tool_run(blobs)
    assert outcome.outcome == "failed"  # not `timeout` at the deadline a minute later
    assert "the blob store failed" in outcome.value["error"] and "NoSuchBucket" in outcome.value["error"]
    assert outcome.value["transient"] is False and outcome.value["event_type"] == "aaa.tool.requested"
    assert waited == [] and blobs.puts == 1  # persistent: not tried again
    assert len(bus.errors) == 1 and isinstance(bus.errors[0], BlobStoreUnavailable)
    assert of_type(log, "aaa.tool.completed") == [] and log[-1].type == "aaa.run.completed"


def test_a_blob_store_outage_is_retried_then_fails_the_run():
    blobs = RefusingBlobs(transient=True)
    outcome, waited, bus, _ = big_tool_run(blobs)
    assert outcome.outcome == "failed" and outcome.value["attempts"] == 4
    assert waited == [0.1, 0.2, 0.4] and blobs.puts == 4


def test_a_handler_bug_fails_the_run_with_its_traceback():
    class Broken:
        async def __call__(self, event):
            raise KeyError("a bug in the handler")

    async def scenario():
        bus, waited = recording_bus()
        async with make_engine(big_then_answer, bus=bus) as engine:
            engine.subscribe("aaa.tool.requested", Broken())
            run = await engine.start(ToolLoop(ToolRegistry([big])), {"task": "big"}, run_id="run-h")
            outcome = await run.result(timeout=5)
            await engine.drain(5)
            return outcome, waited, engine

    outcome, waited, engine = arun(scenario())
    assert outcome.outcome == "failed" and waited == []
    assert outcome.value["error"] == "KeyError: 'a bug in the handler'"
    assert "raise KeyError" in outcome.value["traceback"]
    assert len(engine.errors) == 1 and isinstance(engine.errors[0], KeyError)
