"""``AnthropicClient``: Claude models through Anthropic's Messages API.

An optional extra (``pip install 'aaa_django[anthropic]'``): the ``anthropic`` SDK is
imported when a client is built, and a clear ``ImportError`` says how to install it::

    from aaa_django.llm.anthropic_client import AnthropicClient

    client = AnthropicClient(None, key, "claude-sonnet-4-5", max_tokens=4096,
                             pricing={"claude-sonnet-4-5": {"input": 3.0, "output": 15.0}})

Mapping: ``system`` messages go, joined, into the request's ``system``; an
``assistant`` message's tool calls become ``tool_use`` blocks; ``tool`` messages
become ``tool_result`` blocks of a ``user`` message (consecutive results and the
user's next words share one message, as the API wants); a tool spec
``{"name", "description", "parameters"}`` becomes ``{"name", "description",
"input_schema"}``. The reply's ``stop_reason`` is reported in OpenAI's words
(``end_turn`` -> ``stop``, ``tool_use`` -> ``tool_calls``, ``max_tokens`` ->
``length``); input tokens include cache writes and reads. ``max_tokens`` (the API
requires it) comes from ``LLMRequest.params`` or else the client's default; other
params go into the request body as given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

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
    from anthropic import AsyncAnthropic
    from anthropic.types import Message as AnthropicReply

#: ``stop_reason`` -> the finish reasons the OpenAI-compatible client reports
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def _import_anthropic() -> ModuleType:
    try:
        import anthropic
    except ImportError:
        raise ImportError(
            "AnthropicClient needs the 'anthropic' package, an optional extra: pip install 'aaa_django[anthropic]'"
        ) from None
    return anthropic


class AnthropicClient(ProviderClient["AsyncAnthropic"]):
    """An :class:`~aaa_django.llm.client.LLMClient` for Anthropic's Messages API.

    ``base_url`` None: Anthropic's; ``api_key`` None: the SDK's own lookup
    (``ANTHROPIC_API_KEY``...). ``max_tokens`` is the reply limit when a request's
    params give none. The rest as :class:`~aaa_django.llm.openai_client.OpenAICompatibleClient`.
    """

    provider = "anthropic"

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str | None,
        *,
        max_tokens: int = 4096,
        default_headers: Mapping[str, str] | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        self._anthropic = _import_anthropic()  # fail at start-up, not at the first call
        super().__init__(base_url=base_url, api_key=api_key, model=model, default_headers=default_headers, **options)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        self.max_tokens = max_tokens

    def make_sdk(self) -> AsyncAnthropic:
        sdk = self._anthropic.AsyncAnthropic(**self.sdk_options())
        # without an api_key the SDK finds one itself (ANTHROPIC_API_KEY...): mask it too
        self.add_secret(getattr(sdk, "api_key", None))
        self.add_secret(getattr(sdk, "auth_token", None))
        return sdk

    def payload(self, request: LLMRequest, model: str) -> dict[str, Any]:
        system, messages = to_anthropic_messages(request.messages)
        params = dict(request.params or {})
        kwargs: dict[str, Any] = {
            "model": model,
            "max_tokens": params.pop("max_tokens", self.max_tokens),
            "messages": messages,
        }
        if system:
            kwargs["system"] = system
        if request.tools:
            kwargs["tools"] = to_anthropic_tools(request.tools)
        if params:
            kwargs["extra_body"] = params
        return kwargs

    async def send(self, sdk: AsyncAnthropic, payload: dict[str, Any]) -> AnthropicReply:
        return await sdk.messages.create(**payload)

    async def send_streaming(
        self, sdk: AsyncAnthropic, payload: dict[str, Any], on_text: Callable[[str], None]
    ) -> AnthropicReply:
        # the SDK's stream helper gathers the events into the Message create() returns
        async with sdk.messages.stream(**payload) as stream:
            async for text in stream.text_stream:
                on_text(text)
            return await stream.get_final_message()

    def parse(self, raw: object) -> tuple[Message, Usage, str | None, str | None]:
        if not hasattr(raw, "model_dump"):
            raise malformed(f"the reply is not a message but {type(raw).__name__}: {str(raw)[:200]!r}")
        return from_anthropic_message(raw.model_dump())

    def classify(self, exc: BaseException) -> Failure | None:
        return classify_sdk_error(self._anthropic, self._anthropic.AnthropicError, exc, self.timeout)


# -- the mapping, both ways (pure) ------------------------------------------------------


class AnthropicMessage(TypedDict):
    """A Messages API message: its role and content blocks."""

    role: str
    content: list[JSONObject]


def to_anthropic_messages(messages: Iterable[Message]) -> tuple[str, list[AnthropicMessage]]:
    """Our messages as (system prompt, Messages API messages)."""
    system: list[str] = []
    out: list[AnthropicMessage] = []

    def add(role: str, blocks: list[JSONObject]) -> None:
        if out and out[-1]["role"] == role:  # the API wants roles to alternate
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system":
            if m.content:
                system.append(m.content)
        elif m.role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.content or ""}])
        elif m.role == "assistant":
            blocks: list[JSONObject] = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [
                {"type": "tool_use", "id": c.id or "", "name": c.name, "input": dict(c.arguments)} for c in m.tool_calls
            ]
            add("assistant", blocks or [{"type": "text", "text": "(no reply)"}])
        else:
            add("user", [{"type": "text", "text": m.content or ""}])
    return "\n\n".join(system), out


def to_anthropic_tools(tools: Iterable[Mapping[str, JSONValue]]) -> list[JSONObject]:
    """Our tool specs as Messages API tools."""
    out = []
    for t in tools:
        tool: JSONObject = {
            "name": t["name"],
            "input_schema": t.get("parameters") or {"type": "object", "properties": {}},
        }
        if t.get("description"):
            tool["description"] = t["description"]
        out.append(tool)
    return out


def from_anthropic_message(data: Mapping[str, Any]) -> tuple[Message, Usage, str | None, str | None]:
    """A Messages API reply's JSON as (message, usage, model, finish reason)."""
    blocks = data.get("content")
    if data.get("type") not in (None, "message") or not isinstance(blocks, list):
        raise malformed(f"the reply is not a message: {str(dict(data))[:200]}")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for b in blocks:
        if not isinstance(b, Mapping):
            raise malformed(f"a content block is not an object: {str(b)[:200]!r}")
        if b.get("type") == "text":
            texts.append(b.get("text") or "")
        elif b.get("type") == "tool_use":
            name = b.get("name")
            if not isinstance(name, str) or not name:
                raise malformed(f"a tool_use block without a name: {str(dict(b))[:200]}")
            calls.append(ToolCall(id=b.get("id") or None, name=name, arguments=tool_arguments(b.get("input"), name)))
        # thinking and server-tool blocks are not part of our message
    usage = data.get("usage")
    if not isinstance(usage, Mapping):
        usage = {}
    input_tokens = sum(
        token_count(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    stop = data.get("stop_reason")
    return (
        Message(role="assistant", content="".join(texts) if texts else None, tool_calls=tuple(calls)),
        Usage(input_tokens=input_tokens, output_tokens=token_count(usage.get("output_tokens"))),
        data.get("model") if isinstance(data.get("model"), str) else None,
        FINISH.get(stop, stop) if isinstance(stop, str) else None,
    )
