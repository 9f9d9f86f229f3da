"""A small model server for the field tests, speaking OpenAI's and Anthropic's wire formats.

    python -m tests.field.model_server PORT [--latency MIN MAX] [--seed N] [--hold FILE] [--log FILE]

``POST /v1/chat/completions`` as OpenAI does and ``POST /v1/messages`` as Anthropic does,
each plain or streamed (``"stream": true``: chat-completion chunks, or Messages events).
It answers as a model that calls only the tools it is offered:

- offered no tool: it says so, in prose (:data:`NO_TOOLS`);
- a task that is a JSON object ``{"call": tool, "args": {...}}``: it calls that tool, if
  it is offered (else it says so);
- any other task, offered ``lookup_population``: it asks for two tool calls at once
  (the example site's ``lookup_population`` for Lyon and Porto);
- given the results: it answers in text. For the populations, with their sum and a
  fingerprint of the task (its length and SHA-256, :func:`answer`), so the field test
  knows the one right answer of each run; else with what the tool said
  (:func:`said`).

Each answer comes after a random delay between MIN and MAX seconds (a model thinks);
while the hold FILE exists, none comes (the calls wait: a test holds its runs in flight
while it breaks things). With ``--log FILE`` each request is appended to FILE as a JSON
line (:func:`seen`: its path, model, whether it streamed, the tools offered, its task).
It prints ``ready`` once it listens. :class:`ModelServer` runs it in a thread of the
test's own process instead (``server.requests``).

It counts the calls it receives, as a provider bills them: ``GET /calls`` lists each
request, in the order they came, with the time it came (``at``, epoch seconds), its
``turn`` (1 before any tool result, then 2), the caller's address (``peer``) and,
with ``--pids``, when the caller is a process of this machine's network namespace,
its PID (``pid``; else None): how many times a run's request was paid for, and by
whom. ``--host`` is the address it listens on (``0.0.0.0``: every one, for a test's
network namespace). It takes as many connections at once as a load opens (a backlog
of 4,096) and answers each in a thread of its own: a thousand calls of 1 s take about
1 s (``--pids`` scans /proc for every call, and serialises such a load).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.llm.streams import anthropic_stream, openai_stream

CITIES = ("Lyon", "Porto")
#: what it says when it is offered no tool
NO_TOOLS = "I was offered no tools, so I cannot look anything up."
OPENAI = "/v1/chat/completions"
ANTHROPIC = "/v1/messages"


def fingerprint(task: str) -> str:
    """What the model says about a task: its length and the start of its SHA-256."""
    return f"{len(task)} chars, sha256 {hashlib.sha256(task.encode()).hexdigest()[:16]}"


def answer(task: str, populations: list[int]) -> str:
    """The final answer it gives for ``task`` after looking the populations up."""
    return f"task of {fingerprint(task)}: Lyon and Porto have {sum(populations)} inhabitants"


def said(results: list[str]) -> str:
    """The final answer it gives after any other tool's results."""
    return "the tool said: " + "; ".join(results)


@dataclass
class Turn:
    """A request, read the same from either wire format."""

    task: str
    offered: list[str]
    #: the names of the tools its last reply called (empty: none yet)
    called: list[str]
    #: what those calls returned, in order
    results: list[str]


@dataclass
class Decision:
    text: str | None = None
    #: (name, arguments) of each tool call
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def decide(turn: Turn) -> Decision:
    """What the model answers (see the module docstring)."""
    if turn.results:
        if turn.called and set(turn.called) == {"lookup_population"}:
            return Decision(text=answer(turn.task, [int(r) for r in turn.results]))
        return Decision(text=said(turn.results))
    if not turn.offered:
        return Decision(text=NO_TOOLS)
    plan = _plan(turn.task)
    if plan is not None:
        name, args = plan
        if name not in turn.offered:
            return Decision(text=f"I was not offered {name} (offered: {', '.join(turn.offered)}).")
        return Decision(calls=[(name, args)])
    if "lookup_population" in turn.offered:
        return Decision(calls=[("lookup_population", {"city": c}) for c in CITIES])
    return Decision(text=f"None of my tools helps here (offered: {', '.join(turn.offered)}).")


def _plan(task: str) -> tuple[str, dict[str, Any]] | None:
    try:
        plan = json.loads(task)
    except ValueError:
        return None
    if isinstance(plan, dict) and isinstance(plan.get("call"), str):
        return plan["call"], dict(plan.get("args") or {})
    return None


# -- OpenAI's chat completions ------------------------------------------------------------------


def openai_turn(body: dict[str, Any]) -> Turn:
    messages = body["messages"]
    task = next(_text(m["content"]) for m in messages if m["role"] == "user")
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    called = [c["function"]["name"] for c in (messages[last].get("tool_calls") or [])] if last >= 0 else []
    results = [_text(m["content"]) for m in messages[last + 1 :] if m["role"] == "tool"] if called else []
    return Turn(task, [t["function"]["name"] for t in body.get("tools") or ()], called, results)


def openai_reply(body: dict[str, Any], d: Decision, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": d.text}
    if d.calls:
        message["tool_calls"] = [
            {"id": f"call_{n}_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate(d.calls)
        ]
    prompt = _tokens(body["messages"])
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "field-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if d.calls else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20},
    }


def openai_parts(body: dict[str, Any], d: Decision, n: int) -> list[bytes]:
    calls = [(f"call_{n}_{i}", name, json.dumps(args)) for i, (name, args) in enumerate(d.calls)]
    return openai_stream(
        _pieces(d.text), calls=calls, model=body.get("model") or "field-model", usage=(_tokens(body["messages"]), 20)
    )


# -- Anthropic's Messages ------------------------------------------------------------------------


def anthropic_turn(body: dict[str, Any]) -> Turn:
    messages = [{"role": m["role"], "blocks": _blocks(m["content"])} for m in body["messages"]]
    task = next(b["text"] for m in messages if m["role"] == "user" for b in m["blocks"] if b["type"] == "text")
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    called = [b["name"] for b in messages[last]["blocks"] if b["type"] == "tool_use"] if last >= 0 else []
    results = (
        [_text(b.get("content")) for m in messages[last + 1 :] for b in m["blocks"] if b["type"] == "tool_result"]
        if called
        else []
    )
    return Turn(task, [t["name"] for t in body.get("tools") or ()], called, results)


def anthropic_reply(body: dict[str, Any], d: Decision, n: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": d.text}] if d.text else []
    content += [
        {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": args}
        for i, (name, args) in enumerate(d.calls)
    ]
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or "field-model",
        "content": content,
        "stop_reason": "tool_use" if d.calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": _tokens(body["messages"]), "output_tokens": 20},
    }


def anthropic_parts(body: dict[str, Any], d: Decision, n: int) -> list[bytes]:
    calls = [(f"toolu_{n}_{i}", name, json.dumps(args)) for i, (name, args) in enumerate(d.calls)]
    return anthropic_stream(
        _pieces(d.text), calls=calls, model=body.get("model") or "field-model", usage=(_tokens(body["messages"]), 20)
    )


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _text(content: Any) -> str:
    """A message's or a tool result's text (a string, or blocks of text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return "" if content is None else str(content)


def _pieces(text: str | None) -> list[str]:
    """The text in three pieces, as a stream sends it."""
    if not text:
        return []
    k = max(1, len(text) // 3)
    return [p for p in (text[:k], text[k : 2 * k], text[2 * k :]) if p]


def _tokens(messages: list[dict[str, Any]]) -> int:
    return max(1, len(json.dumps(messages)) // 4)


def seen(path: str, body: dict[str, Any], turn: Turn) -> dict[str, Any]:
    """What the server records of a request: its path, model, whether it streamed, the
    tools offered, and the task it is about."""
    return {
        "path": path,
        "model": body.get("model"),
        "stream": bool(body.get("stream")),
        "tools": turn.offered,
        "task": turn.task,
    }


# -- the server ------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    # A provider takes every connection a load opens at once; the standard library's
    # backlog of 5 drops the SYNs of a thousand runs' calls, and each connect then waits
    # out the kernel's retransmits (1 s, 3 s, 7 s, ...) or fails: the harness's limit,
    # not the app's.
    request_queue_size = 4096


class ModelServer:
    """The server on ``port`` (0: a free one), in a daemon thread (``with ModelServer() as s``)
    or in the foreground (:meth:`serve_forever`). ``requests``: what it was asked
    (:func:`seen`), in order."""

    def __init__(
        self,
        port: int = 0,
        *,
        latency: tuple[float, float] = (0.0, 0.0),
        seed: int = 12,
        hold: Path | None = None,
        log: Path | None = None,
        host: str = "127.0.0.1",
        pids: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        #: look up each caller's PID (:func:`caller_pid`: a scan of /proc for every
        #: request, which serialises a load of hundreds of calls: only where a test reads it)
        self.pids = pids
        self.latency = latency
        self.hold = hold
        self.log = log
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.httpd = _Server((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def record(
        self, path: str, body: dict[str, Any], turn: Turn, caller: tuple[str, int] | None = None
    ) -> tuple[int, float]:
        """Note the request (``caller``: its address and port); return its number and
        how long to think."""
        entry = {**seen(path, body, turn), "at": time.time(), "turn": 1 + bool(turn.results)}
        if caller is not None:
            entry.update(peer=caller[0], pid=caller_pid(caller[1]) if self.pids else None)
        with self.lock:
            self.requests.append(entry)
            if self.log is not None:
                with open(self.log, "a") as f:
                    f.write(json.dumps(entry) + "\n")
            return len(self.requests), self.rng.uniform(*self.latency)

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def __enter__(self) -> ModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


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


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/calls":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            with server.lock:
                calls = list(server.requests)
            self._send(200, {"calls": calls})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            path = self.path.split("?", 1)[0].rstrip("/")
            if path not in (OPENAI, ANTHROPIC):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            openai = path == OPENAI
            turn = openai_turn(body) if openai else anthropic_turn(body)
            n, delay = server.record(path, body, turn, self.client_address)
            while server.hold is not None and server.hold.exists():
                time.sleep(0.05)
            time.sleep(delay)
            d = decide(turn)
            if body.get("stream"):
                self._stream(openai_parts(body, d, n) if openai else anthropic_parts(body, d, n))
            else:
                self._send(200, openai_reply(body, d, n) if openai else anthropic_reply(body, d, n))

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

        def _stream(self, parts: list[bytes]) -> None:
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in parts:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                self.close_connection = True

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("--latency", type=float, nargs=2, default=(0.3, 1.0))
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--hold", type=Path, default=None)
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every one)")
    parser.add_argument("--pids", action="store_true", help="each call's caller's PID (a scan of /proc a call)")
    args = parser.parse_args()
    server = ModelServer(
        args.port,
        latency=tuple(args.latency),
        seed=args.seed,
        hold=args.hold,
        log=args.log,
        host=args.host,
        pids=args.pids,
    )
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
