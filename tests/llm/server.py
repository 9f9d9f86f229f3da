"""A local HTTP server that replays recorded provider responses, one per request.

    with RecordedServer() as server:
        server.script(Reply.recorded("openai/text"), Reply(status=500, body={...}))
        client = OpenAICompatibleClient(server.url + "/v1", KEY, "gpt-4o-mini")
        ...
        server.requests[0].json   # what the client sent

stdlib ``http.server`` on a free loopback port, in a daemon thread: the SDKs talk
real HTTP to it (their transport is not mocked). A reply can be slow (``delay``), held
until the test releases it (``hold``), cut off mid-body (``drop``), or a stream
(``parts``: sent one by one, chunked; a part may wait for an event, ``holds``). A
request with no scripted reply left gets a 599 whose
message says so.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RECORDINGS = Path(__file__).parent / "recordings"


def recording(name: str) -> dict[str, Any]:
    """A recorded exchange ``{"request": ..., "response": {"status", "headers", "body"}}``
    (``name`` like ``"openai/text"``)."""
    return json.loads((RECORDINGS / f"{name}.json").read_text())


@dataclass
class Reply:
    status: int = 200
    #: a JSON value, or raw bytes sent as they are
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: seconds to wait before answering
    delay: float = 0.0
    #: send the headers and half the body, then close the connection
    drop: bool = False
    #: a streamed body (Server-Sent Events): each part a chunk of its own
    parts: list[bytes] | None = None
    #: part i is sent once ``holds[i]`` is set (a test's proof that the client had
    #: the parts before it while the reply was not whole)
    holds: dict[int, threading.Event] = field(default_factory=dict)
    #: answer only once this is set (or after ``delay`` seconds, whichever is first)
    hold: threading.Event | None = None
    #: seconds a hold of ``holds`` waits before the reply is ended short
    hold_seconds: float = 10.0

    @classmethod
    def recorded(cls, name: str, **changes: Any) -> "Reply":
        """The recorded response of exchange ``name``; ``headers`` given are merged in."""
        r = recording(name)["response"]
        headers = {**r.get("headers", {}), **changes.pop("headers", {})}
        return cls(status=r["status"], body=r["body"], headers=headers, **changes)

    def encoded(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class RecordedServer:
    """The server; use it as a context manager (it stops on exit)."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.02,), name="recorded-server", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def script(self, *replies: Reply) -> "RecordedServer":
        with self.lock:
            self.replies.extend(replies)
        return self

    def next_reply(self, received: Received) -> Reply:
        with self.lock:
            self.requests.append(received)
            if self.replies:
                return self.replies.pop(0)
        return Reply(status=599, body={"error": {"message": "test server: no scripted reply left"}})

    def __enter__(self) -> "RecordedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: RecordedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real providers do

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received = Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            reply = server.next_reply(received)
            if reply.hold is not None:
                reply.hold.wait(reply.delay or None)
            elif reply.delay:
                time.sleep(reply.delay)
            if reply.parts is not None:
                self.stream(reply)
                return
            data = reply.encoded()
            try:
                self.send_response(reply.status)
                headers = {"content-type": "application/json", **{k.lower(): v for k, v in reply.headers.items()}}
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if reply.drop:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(data)
            except OSError:  # the client gave up (a timeout test): nothing to answer
                self.close_connection = True

        def stream(self, reply: Reply) -> None:
            assert reply.parts is not None
            try:
                self.send_response(reply.status)
                self.send_header("content-type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, part in enumerate(reply.parts):
                    if i in reply.holds and not reply.holds[i].wait(reply.hold_seconds):
                        break  # the client never saw the parts before: end the reply short
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                self.close_connection = True

    return Handler
