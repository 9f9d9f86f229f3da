"""Run one ToolLoop end to end on the site's database, with a scripted model.

    python manage.py aaa_demo [--task TEXT] [--quiet]

No model provider is called: the model is a FakeLLMClient following a fixed script
(look up two cities' populations with a tool, then answer), and the command says so.
The run is stored in the site's database like any other, so it shows in the admin.
"""

from __future__ import annotations

from collections.abc import Sequence

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand, CommandParser

from aaa_django.algos import ToolLoop
from aaa_django.events import Event
from aaa_django.llm import FakeLLMClient, LLMClient, LLMHandler, LLMRequest, LLMResponse
from aaa_django.llm.fake import text, tool_call
from aaa_django.management.progress import Progress
from aaa_django.runtime import InProcessBus, Outcome
from aaa_django.site.engines import build_engine
from aaa_django.site.llm_settings import client_from_settings
from aaa_django.tools import ToolHandler, ToolRegistry, tool

POPULATIONS = {"Lyon": 522_250, "Porto": 231_800}


def _lookup_population(city: str) -> int:
    """The population of a city (a canned table: this is a demo tool)."""
    if city not in POPULATIONS:
        raise ValueError(f"no population known for {city!r}")
    return POPULATIONS[city]


def _scripted_model(request: LLMRequest) -> LLMResponse:
    """Ask the tool for each city, then answer from the tool results."""
    asked = [m for m in request.messages if m.role == "tool"]
    cities = list(POPULATIONS)
    if len(asked) < len(cities):
        return tool_call("lookup_population", city=cities[len(asked)])
    total = sum(int(m.content or 0) for m in asked)
    return text(f"Lyon and Porto have {total:,} inhabitants together.")


class _Counted:
    """Advances the progress bar by each event the run appends."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar

    async def appended(self, events: Sequence[Event]) -> None:
        self.bar.advance(len(events))


class Command(BaseCommand):
    help = "Run a ToolLoop with a scripted model (no provider is called) and print its outcome."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", default="How many people live in Lyon and Porto together?")
        parser.add_argument("--quiet", action="store_true", help="print the outcome only")

    def handle(self, *args: object, task: str, quiet: bool, **options: object) -> None:
        client = client_from_settings()
        with Progress("events", stream=self.stderr) as bar:  # on a terminal only
            outcome, run_id, events = async_to_sync(self._run)(task, client, bar)
        if not quiet:
            if client is None:
                self.stdout.write(
                    "Model: a scripted FakeLLMClient (no model provider is configured, "
                    "none is called; the answers below follow a fixed script). Set "
                    "AAA_LLM_BASE_URL, AAA_LLM_API_KEY and AAA_LLM_MODEL to use a real one."
                )
            else:
                self.stdout.write(f"Model: {client!r}")
            self.stdout.write(f"Run {run_id}: {len(events)} events")
            for e in events:
                self.stdout.write(f"  {e.seq:>3}  {e.type}")
        self.stdout.write(f"Outcome: {outcome.outcome}  value: {outcome.value}")

    async def _run(self, task: str, client: LLMClient | None, bar: Progress) -> tuple[Outcome, str, list[Event]]:
        registry = ToolRegistry([tool(_lookup_population, name="lookup_population")])
        # The in-process bus whatever AAA["BUS"] says: this command's own handlers
        # (the scripted model, the demo tool) must be the ones that answer.
        async with build_engine(bus=InProcessBus()) as engine:
            engine.observe(_Counted(bar))
            LLMHandler(client or FakeLLMClient(_scripted_model)).attach(engine)
            ToolHandler(registry).attach(engine)
            run = await engine.start(ToolLoop(registry), {"task": task})
            outcome = await run.result()
            events = await engine.store.read(run.run_id)
        return outcome, run.run_id, events
