"""A tiny OpenAI-compatible server for the tests: ``/v1/chat/completions`` answered by
a rule, not a script, so any number of runs in any process can talk to it at once.

The rule: the last message is a tool's result -> answer ``"The tool said: <result>"``;
a tool is offered -> call the first one with ``{"city": "Lyon"}``; else ``"Hello."``.
stdlib ``http.server`` on a free loopback port, in a daemon thread.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion the rule gives for a request body."""
    last = body["messages"][-1]
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if last["role"] == "tool":
        message["content"] = f"The tool said: {last['content']}"
        finish = "stop"
    elif body.get("tools"):
        name = body["tools"][0]["function"]["name"]
        message["tool_calls"] = [
            {
                "id": f"call_{next(_ids)}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps({"city": "Lyon"})},
            }
        ]
        finish = "tool_calls"
    else:
        message["content"] = "Hello."
        finish = "stop"
    chars = sum(len(json.dumps(m)) for m in body["messages"])
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 1764000000,
        "model": "local-echo-1",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": chars // 4, "completion_tokens": 7, "total_tokens": chars // 4 + 7},
    }


class LocalOpenAIServer:
    """``with LocalOpenAIServer() as s: s.url + "/v1"``; ``s.requests`` counts the calls."""

    def __init__(self) -> None:
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                server.requests += 1
                data = json.dumps(answer(body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "LocalOpenAIServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
