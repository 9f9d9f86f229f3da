"""``OpenAICompatibleClient``: any server speaking OpenAI's chat completions API.

One client for OpenAI itself and the servers that copy its API: vLLM
(``http://host:8000/v1``), Ollama (``http://localhost:11434/v1``), LM Studio
(``http://localhost:1234/v1``), a llama.cpp server (``http://localhost:8080/v1``)::

    from aaa_django.llm import LLMHandler
    from aaa_django.llm.openai_client import OpenAICompatibleClient

    client = OpenAICompatibleClient("https://api.openai.com/v1", key, "gpt-4o-mini",
                                    pricing={"gpt-4o-mini": {"input": 0.15, "output": 0.60}})
    LLMHandler(client).attach(engine)

It runs on the official ``openai`` SDK (``pip install 'aaa_django[openai]'``),
imported when a client is built. Mapping: our ``assistant`` message's tool calls
become ``tool_calls`` with JSON-string ``arguments``; a ``tool`` message becomes
``{"role": "tool", "tool_call_id": ..., "content": ...}``; a tool spec
``{"name", "description", "parameters"}`` becomes ``{"type": "function",
"function": {...}}``. ``LLMRequest.params`` (``temperature``, ``max_tokens``...) go
into the request body as given. Retries, timeouts, cost and secrets: see
:mod:`aaa_django.llm.provider` and ``docs/models.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Unpack

from aaa_django.data.jsonvalue import JSONObject, JSONValue

from .messages import LLMRequest, Message, ToolCall, Usage
from .provider import (
    ClientOptions,
    ProviderClient,
    classify_sdk_error,
    malformed,
    token_count,
    tool_arguments,
)
from .retry import Failure

if TYPE_CHECKING:  # an optional dependency: imported where it is used
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion

#: sent as the key to servers that need none (Ollama, llama.cpp), so the SDK does
#: not go looking for OPENAI_API_KEY
NO_KEY = "no-key"


def _import_openai() -> ModuleType:
    try:
        import openai
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError(
            "OpenAICompatibleClient needs the 'openai' package: pip install 'aaa_django[openai]'"
        ) from None
    return openai


class OpenAICompatibleClient(ProviderClient["AsyncOpenAI"]):
    """An :class:`~aaa_django.llm.client.LLMClient` for OpenAI-compatible servers.

    ``base_url`` ends in ``/v1`` (None: OpenAI's); ``api_key`` None sends a
    placeholder (local servers need none); ``model`` is used when a request names
    none; ``timeout`` bounds each HTTP attempt (seconds); ``max_retries`` transient
    failures are retried (:mod:`~aaa_django.llm.retry`); ``pricing`` is a table
    ``{model: {"input": $/1M tokens, "output": $/1M tokens}}``; ``sleep`` waits between
    attempts (default ``asyncio.sleep``; a test passes one that records the delays).
    """

    provider = "openai-compatible"

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str | None,
        *,
        default_headers: Mapping[str, str] | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        self._openai = _import_openai()  # fail at start-up, not at the first call
        super().__init__(base_url=base_url, api_key=api_key, model=model, default_headers=default_headers, **options)

    def make_sdk(self) -> AsyncOpenAI:
        options = self.sdk_options()
        return self._openai.AsyncOpenAI(**{**options, "api_key": options["api_key"] or NO_KEY})

    def payload(self, request: LLMRequest, model: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": model, "messages": to_openai_messages(request.messages)}
        if request.tools:
            kwargs["tools"] = to_openai_tools(request.tools)
        if request.params:
            kwargs["extra_body"] = dict(request.params)
        return kwargs

    async def send(self, sdk: AsyncOpenAI, payload: dict[str, Any]) -> ChatCompletion:
        return await sdk.chat.completions.create(**payload)

    async def send_streaming(
        self, sdk: AsyncOpenAI, payload: dict[str, Any], on_text: Callable[[str], None]
    ) -> dict[str, Any]:
        # include_usage: the last chunk carries the usage, so a streamed call is priced
        chunks = await sdk.chat.completions.create(**payload, stream=True, stream_options={"include_usage": True})
        reply = ChunkedCompletion()
        async with chunks:
            async for chunk in chunks:
                on_text(reply.add(chunk.model_dump()))
        return reply.data

    def parse(self, raw: object) -> tuple[Message, Usage, str | None, str | None]:
        if isinstance(raw, Mapping):  # a streamed reply, gathered
            return from_openai_completion(raw)
        if not hasattr(raw, "model_dump"):
            raise malformed(f"the reply is not a chat completion but {type(raw).__name__}: {str(raw)[:200]!r}")
        return from_openai_completion(raw.model_dump())

    def classify(self, exc: BaseException) -> Failure | None:
        return classify_sdk_error(self._openai, self._openai.OpenAIError, exc, self.timeout)


# -- the mapping, both ways (pure) ------------------------------------------------------


def to_openai_messages(messages: Iterable[Message]) -> list[JSONObject]:
    """Our messages as chat-completions messages."""
    out: list[JSONObject] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content or ""})
        elif m.role == "assistant":
            msg: JSONObject = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                    }
                    for c in m.tool_calls
                ]
            out.append(msg)
        else:
            msg = {"role": m.role, "content": m.content or ""}
            if m.name:
                msg["name"] = m.name
            out.append(msg)
    return out


def to_openai_tools(tools: Iterable[Mapping[str, JSONValue]]) -> list[JSONObject]:
    """Our tool specs (``{"name", "description", "parameters"}``) as function tools."""
    out: list[JSONObject] = []
    for t in tools:
        function: JSONObject = {
            "name": t["name"],
            "parameters": t.get("parameters") or {"type": "object", "properties": {}},
        }
        if t.get("description"):
            function["description"] = t["description"]
        out.append({"type": "function", "function": function})
    return out


class ChunkedCompletion:
    """A chat completion gathered from its stream's chunks (``chat.completion.chunk``),
    in the shape :func:`from_openai_completion` reads: the first choice's text and
    refusal joined, tool calls joined by their ``index``, the finish reason, the model
    and the usage of the last chunk (``stream_options.include_usage``)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"choices": [], "usage": None, "model": None}
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: Mapping[str, Any]) -> str:
        """Fold one chunk in; return its text (``""`` when it has none)."""
        if isinstance(chunk.get("model"), str):
            self.data["model"] = chunk["model"]
        if isinstance(chunk.get("usage"), Mapping):
            self.data["usage"] = chunk["usage"]
        text = ""
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue  # we ask for one choice
            if not self.data["choices"]:
                self.data["choices"].append({"message": {"content": None}, "finish_reason": None})
            out = self.data["choices"][0]
            if choice.get("finish_reason"):
                out["finish_reason"] = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, Mapping):
                continue
            msg = out["message"]
            for key in ("content", "refusal"):
                piece = delta.get(key)
                if isinstance(piece, str) and piece:
                    msg[key] = (msg.get(key) or "") + piece
                    if key == "content":
                        text += piece
            for call in delta.get("tool_calls") or ():
                if isinstance(call, Mapping):
                    self._add_call(call)
            if self._calls:
                msg["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        return text

    def _add_call(self, call: Mapping[str, Any]) -> None:
        given = call.get("index")
        index = given if isinstance(given, int) else len(self._calls)
        into = self._calls.setdefault(index, {"id": None, "function": {"name": "", "arguments": ""}})
        if call.get("id"):
            into["id"] = call["id"]
        function = call.get("function")
        if isinstance(function, Mapping):
            for key in ("name", "arguments"):
                if isinstance(function.get(key), str):
                    into["function"][key] += function[key]


def from_openai_completion(data: Mapping[str, Any]) -> tuple[Message, Usage, str | None, str | None]:
    """A chat completion's JSON as (message, usage, model, finish reason)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise malformed(f"the reply has no choices: {json.dumps(data, default=str)[:200]}")
    choice = choices[0]
    msg = choice.get("message")
    if not isinstance(msg, Mapping):
        raise malformed("the reply's first choice has no message")
    content = msg.get("content")
    if content is None and isinstance(msg.get("refusal"), str):
        content = msg["refusal"]
    if content is not None and not isinstance(content, str):
        raise malformed(f"the reply's content is not text: {str(content)[:200]!r}")
    calls = []
    for c in msg.get("tool_calls") or ():
        function = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(function, Mapping):
            function = {}
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise malformed(f"a tool call without a function name: {str(c)[:200]!r}")
        calls.append(
            ToolCall(id=c.get("id") or None, name=name, arguments=tool_arguments(function.get("arguments"), name))
        )
    usage = data.get("usage")
    if not isinstance(usage, Mapping):
        usage = {}
    return (
        Message(role="assistant", content=content, tool_calls=tuple(calls)),
        Usage(
            input_tokens=token_count(usage.get("prompt_tokens")),
            output_tokens=token_count(usage.get("completion_tokens")),
        ),
        data.get("model") if isinstance(data.get("model"), str) else None,
        choice.get("finish_reason"),
    )
