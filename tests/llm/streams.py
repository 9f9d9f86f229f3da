"""Streamed replies in each provider's wire format, for :class:`~tests.llm.server.Reply`'s
``parts``: OpenAI's chat-completion chunks (``data: {...}`` lines, ``data: [DONE]``)
and Anthropic's Messages stream (``event: content_block_delta`` ...)."""

from __future__ import annotations

import json
from typing import Any


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def openai_stream(
    texts: list[str],
    *,
    tool: tuple[str, str] | None = None,
    calls: list[tuple[str, str, str]] | None = None,
    model: str = "gpt-4o-mini",
    usage: tuple[int, int] = (12, 5),
) -> list[bytes]:
    """A chat completion streamed: a role chunk, one chunk per text, each tool call in two
    argument pieces (``tool``: name, JSON arguments; ``calls``: several, each id, name,
    JSON arguments), the finish, the usage, [DONE]."""
    calls = list(calls or ()) + ([("call_s1", *tool)] if tool else [])

    def chunk(delta: dict, finish: str | None = None, **extra: Any) -> bytes:
        return sse(
            {
                "id": "chatcmpl-s1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }
        )

    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": t}) for t in texts]
    for i, (call_id, name, args) in enumerate(calls):
        half = len(args) // 2
        parts.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": args[:half]},
                        }
                    ]
                }
            )
        )
        parts.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]}))
    parts.append(chunk({}, "tool_calls" if calls else "stop"))
    parts.append(
        sse(
            {
                "id": "chatcmpl-s1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
            }
        )
    )
    parts.append(b"data: [DONE]\n\n")
    return parts


def anthropic_stream(
    texts: list[str],
    *,
    tool: tuple[str, str] | None = None,
    calls: list[tuple[str, str, str]] | None = None,
    model: str = "claude-haiku-4-5",
    usage: tuple[int, int] = (12, 5),
) -> list[bytes]:
    """A Messages reply streamed: message_start, a text block's deltas, a tool_use block
    per call with its input in two input_json_delta pieces (``tool``: name, JSON input;
    ``calls``: several, each id, name, JSON input), message_delta (stop reason, usage),
    message_stop."""
    calls = list(calls or ()) + ([("toolu_s1", *tool)] if tool else [])
    parts = [
        sse(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_s1",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": usage[0], "output_tokens": 1},
                },
            },
            "message_start",
        ),
    ]
    if texts:  # (a reply of tool calls alone has no text block)
        parts.append(
            sse(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start",
            )
        )
    parts.append(sse({"type": "ping"}, "ping"))
    parts += [
        sse(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}},
            "content_block_delta",
        )
        for t in texts
    ]
    if texts:
        parts.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    for i, (call_id, name, args) in enumerate(calls, 1 if texts else 0):
        half = len(args) // 2
        parts.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": i,
                    "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
                },
                "content_block_start",
            )
        )
        for piece in (args[:half], args[half:]):
            parts.append(
                sse(
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    },
                    "content_block_delta",
                )
            )
        parts.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    parts.append(
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": usage[1]},
            },
            "message_delta",
        )
    )
    parts.append(sse({"type": "message_stop"}, "message_stop"))
    return parts
