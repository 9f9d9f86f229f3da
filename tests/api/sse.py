"""A Server-Sent Events reader for the tests: the messages of a text, or of a live response."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import urlparse


@dataclass(frozen=True)
class Message:
    id: str | None
    event: str
    data: Any


def parse(lines: Iterator[str]) -> Iterator[Message]:
    """The messages of SSE text lines (comments and ``retry:`` blocks skipped)."""
    fields: dict[str, str] = {}
    for line in lines:
        line = line.rstrip("\r\n")
        if line == "":
            if "data" in fields:
                yield Message(fields.get("id"), fields.get("event", "message"), json.loads(fields["data"]))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def messages(text: str | bytes) -> list[Message]:
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return list(parse(iter(text.splitlines())))


class Live:
    """A stream read as it comes: ``next()`` is the next message, None once the server closes."""

    def __init__(self, base: str, path: str, headers: dict[str, str]) -> None:
        u = urlparse(base)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        self.conn.request("GET", path, headers=headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self._lines = (raw.decode("utf-8") for raw in iter(self.response.readline, b""))
        self._messages = parse(self._lines)

    def next(self) -> Message | None:
        return next(self._messages, None)

    def close(self) -> None:
        self.response.close()
        self.conn.close()
