"""What watching costs per hop: the engine with no observer, with the Django signals'
observer (no receiver: tracing off), and with OpenTelemetry on (the SDK, every span
exported to memory, every metric recorded).

    .venv/bin/python benchmarks/bench_observe.py [--runs 200] [--turns 5] [--rounds 5]

ToolLoop runs on the in-process bus and the memory store: the cheapest hop there is
(no database, no broker), so an observer's cost shows at its largest. The
configurations take turns, round after round, so a machine's load weighs on each
alike; it prints the median CPU time per delivery of each (CPU, not wall time: other
processes' load moves it less) and its ratio to no observer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from aaa_django.algos import ToolLoop
    from aaa_django.events import FoldCache, InMemoryEventStore
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.llm.fake import text, tool_calls
    from aaa_django.observe.otel import OtelObserver
    from aaa_django.runtime import Engine
    from aaa_django.signals import SignalSender
    from aaa_django.tools import ToolHandler, ToolRegistry, tool

    @tool(inline=True)
    def noop(n: int = 0) -> int:
        """Does nothing."""
        return n

    registry = ToolRegistry([noop])

    def model(request):
        done = sum(1 for m in request.messages if m.role == "tool")
        return text("done") if done >= args.turns - 1 else tool_calls(("noop", {"n": done}))

    exported = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exported))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def observers(kind: str, engine: Engine) -> list:
        if kind == "none":
            return []
        signals = [SignalSender(engine, None)]
        if kind == "signals (tracing off)":
            return signals
        return [*signals, OtelObserver(engine, tracer_provider=tracer_provider, meter_provider=meter_provider)]

    async def once(kind: str) -> float:
        engine = Engine(store=InMemoryEventStore(), cache=FoldCache())
        for o in observers(kind, engine):
            engine.observe(o)
        LLMHandler(FakeLLMClient(model)).attach(engine)
        ToolHandler(registry).attach(engine)
        deliveries = 0
        async with engine:
            algo = ToolLoop(registry, max_turns=args.turns + 1)
            t0 = time.process_time()
            runs = [await engine.start(algo, {"task": "go"}) for _ in range(args.runs)]
            for run in runs:
                assert (await run.result(timeout=120)).outcome == "success"
            await engine.drain()
            elapsed = time.process_time() - t0
            deliveries = engine.bus.delivered
        exported.clear()
        return elapsed / deliveries

    kinds = ["none", "signals (tracing off)", "OpenTelemetry on"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    asyncio.run(once("none"))  # warm up
    for _ in range(args.rounds):
        for kind in kinds:
            times[kind].append(asyncio.run(once(kind)))
    base = statistics.median(times["none"])
    print(
        f"bench_observe: {args.runs} ToolLoop runs of {args.turns} turns x {args.rounds} rounds, "
        "in-process bus, memory store"
    )
    print()
    print(
        table(
            ["observers", "CPU per delivery (median)", "vs none"],
            [
                [k, f"{statistics.median(v) * 1e6:.1f} us", f"{statistics.median(v) / base:.3f}"]
                for k, v in times.items()
            ],
        )
    )


if __name__ == "__main__":
    main()
