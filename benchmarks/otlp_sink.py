"""An OTLP/HTTP receiver that takes every export and keeps only counts: the far end of
the traced workers' exporters in ``bench_celery.py``. It answers 200 with an empty
export response (what a collector answers when it took everything), and counts the
spans and the traces they belong to (the exporters' requests decoded with the OTLP
protobuf messages), so the benchmark can show that tracing was on.

    python benchmarks/otlp_sink.py PORT      # serves http://127.0.0.1:PORT/v1/traces, /v1/metrics

When it is stopped (SIGTERM) it writes to stdout, on one line: requests, bytes, spans,
traces.
"""

from __future__ import annotations

import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

taken = {"requests": 0, "bytes": 0, "spans": 0}
traces: set[bytes] = set()
lock = threading.Lock()


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the exporters' session reuses its connection

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size)
        spans = (
            [
                s
                for rs in ExportTraceServiceRequest.FromString(body).resource_spans
                for ss in rs.scope_spans
                for s in ss.spans
            ]
            if self.path == "/v1/traces"
            else []
        )
        with lock:
            taken["requests"] += 1
            taken["bytes"] += size
            taken["spans"] += len(spans)
            traces.update(s.trace_id for s in spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")  # an empty Export*ServiceResponse
        self.end_headers()

    def log_message(self, *args) -> None:  # quiet
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)

    def stop(*_) -> None:
        with lock:
            print(taken["requests"], taken["bytes"], taken["spans"], len(traces), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
