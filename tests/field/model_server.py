"""A small OpenAI-compatible model server for the field test, with latency.

    python -m tests.field.model_server PORT [--latency MIN MAX] [--seed N] [--hold FILE]

Speaks ``POST /v1/chat/completions`` as OpenAI does, and follows one script whatever
the task says: the first call asks for two tool calls at once (the example site's
``lookup_population`` for Lyon and Porto), the next answers in text with what the
tools returned and a fingerprint of the task (its length and SHA-256), so the field
test knows the one right answer of each run. Each answer comes after a random delay
between MIN and MAX seconds (a model thinks); while FILE exists, none comes (the calls
wait: a test holds its runs in flight while it breaks things). It prints ``ready``
once it listens.

It counts the calls it receives, as a provider bills them: ``GET /calls`` lists each,
in the order they came, with the time it came (epoch seconds), the caller's address,
the task's fingerprint and the turn (the tool results it was given): how many times a
run's request was paid for, and by whom. ``--tools NAME,NAME`` names the tools the
first call asks for, one call each, with ``{"city": ...}`` arguments (default: the
example site's ``lookup_population`` for Lyon and Porto).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CITIES = ("Lyon", "Porto")


def fingerprint(task: str) -> str:
    """What the model says about a task: its length and the start of its SHA-256."""
    return f"{len(task)} chars, sha256 {hashlib.sha256(task.encode()).hexdigest()[:16]}"


def answer(task: str, populations: list[int]) -> str:
    """The final answer the script gives for ``task`` (the field test expects it)."""
    return f"task of {fingerprint(task)}: Lyon and Porto have {sum(populations)} inhabitants"


def task_of(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def turn_of(body: dict[str, Any]) -> int:
    """Which call of its run a request is: 1 before any tool result, then 2."""
    return 1 + bool([m for m in body["messages"] if m["role"] == "tool"])


def reply(body: dict[str, Any], n: int, tools: tuple[str, ...] = ("lookup_population",) * 2) -> dict[str, Any]:
    """The chat completion for a request (``n``: this server's call count, for ids;
    ``tools``: what the first call asks for, with the cities in turn)."""
    messages = body["messages"]
    task = task_of(body)
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps({"city": CITIES[i % len(CITIES)]})}}
            for i, name in enumerate(tools)]}
        finish = "tool_calls"
    else:
        numbers = [int(m["content"]) for m in results if str(m["content"]).isdigit()]
        message = {"role": "assistant", "content": answer(task, numbers)}
        finish = "stop"
    prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4
    return {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model") or "field-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20},
    }


def caller_pid(port: int) -> int | None:
    """The PID of the process of this machine whose TCP socket has local ``port`` (the
    caller), from /proc; None when it is not found (another network namespace)."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in list(f)[1:]:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                        inode = fields[9]
                        break
        except OSError:
            continue
        if inode:
            break
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) == target:
                    return int(proc.name)
        except OSError:
            continue
    return None


def serve(port: int, latency: tuple[float, float], seed: int, hold: Path | None = None,
          tools: tuple[str, ...] = ("lookup_population",) * 2, host: str = "127.0.0.1") -> None:
    rng = random.Random(seed)
    lock = threading.Lock()
    count = [0]
    calls: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/calls":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            with lock:
                listed = list(calls)
            self._send(200, {"calls": listed})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            with lock:
                count[0] += 1
                n, delay = count[0], rng.uniform(*latency)
                calls.append({"n": n, "at": time.time(), "peer": self.client_address[0],
                              "pid": caller_pid(self.client_address[1]),
                              "task": fingerprint(task_of(body)), "turn": turn_of(body)})
            while hold is not None and hold.exists():
                time.sleep(0.05)
            time.sleep(delay)
            self._send(200, reply(body, n, tools))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up
                self.close_connection = True

    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    print("ready", flush=True)
    httpd.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("--latency", type=float, nargs=2, default=(0.3, 1.0))
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--hold", type=Path, default=None)
    parser.add_argument("--tools", default="lookup_population,lookup_population")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every one)")
    args = parser.parse_args()
    serve(args.port, tuple(args.latency), args.seed, args.hold, tuple(args.tools.split(",")), args.host)


if __name__ == "__main__":
    main()
