"""What kombu's ``channel.Client`` hook buys a send: the CPU of one
``FastPublisher.send`` with ``publish._reuse_redis_client`` and without it (kombu's own
client per message), against a local Redis, in alternating rounds of one process.

    .venv/bin/python benchmarks/bench_publish.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_celery import redis_server  # noqa: E402
from common import workdir  # noqa: E402

SENDS, ROUNDS = 1000, 7


def main() -> None:
    from celery import Celery

    from aaa_django.celery.publish import FastPublisher

    class KombuClientPublisher(FastPublisher):
        """FastPublisher whose channel keeps kombu's own ``Client`` (one per message)."""

        def _get_producer(self):
            if self._producer is None:
                self._producer = self.app.amqp.Producer(self.app.connection_for_write(), auto_declare=False)
            return self._producer

    with workdir() as tmp, redis_server(tmp) as url:
        app = Celery("bench-publish", broker=url, set_as_current=False)
        publishers = {"the hook (one client)": FastPublisher(app),
                      "kombu's client per message": KombuClientPublisher(app)}
        args = ["spec", "run", 1, "id"]
        for p in publishers.values():
            for _ in range(200):  # warm up
                assert p.send("aaa.deliver", args, "bench.publish", repr(args))
        cpu: dict[str, list[float]] = {k: [] for k in publishers}
        for _ in range(ROUNDS):
            for name, p in publishers.items():
                t0 = time.process_time()
                for _ in range(SENDS):
                    p.send("aaa.deliver", args, "bench.publish", repr(args))
                cpu[name].append((time.process_time() - t0) / SENDS)
        base = cpu["the hook (one client)"]
        for name, times in cpu.items():
            ratio = statistics.median(t / b for t, b in zip(times, base))
            print(f"{name:30} {statistics.median(times) * 1e6:7.0f} us CPU a send  {ratio:.2f}x")


if __name__ == "__main__":
    main()
