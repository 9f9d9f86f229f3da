"""``PydanticAIClient``: every model Pydantic AI reaches, as one of our LLM clients.

Pydantic AI talks to dozens of providers (OpenAI and every server that copies its API,
Anthropic, Gemini, Bedrock, Groq, Mistral, Cohere, Ollama, OpenRouter...) through one
``Model`` interface. This client sends our requests through it, with our retry policy,
usage, cost and secrets (:class:`~aaa_django.llm.provider.ProviderClient`)::

    from aaa_django.llm import LLMHandler
    from aaa_django.llm.pydantic_ai_client import PydanticAIClient

    LLMHandler(PydanticAIClient("anthropic:claude-haiku-4-5", api_key=key,
                                pricing={"claude-haiku-4-5": {"input": 1, "output": 5}})).attach(engine)
    PydanticAIClient("openai:llama3.1:8b", base_url="http://localhost:11434/v1")   # any OpenAI-compatible server
    PydanticAIClient(TestModel())                                                   # a Model instance
    PydanticAIClient(lambda: FunctionModel(reply))                                  # a factory of Models

``model`` is a Pydantic AI model name (``"provider:model"``, or ``"test"``), a ``Model``,
or a function returning one. A name or a function builds one ``Model`` per event loop
(its HTTP connections belong to the loop); a ``Model`` instance is used on every loop.
``base_url`` and ``api_key`` go to the provider a name names (for an instance, configure
its provider yourself). A request naming another model (``ToolLoop(model=...)``) is sent
to that name, built the same way.

The provider SDK's own retries are switched off (``ModelSettings["max_retries"] = 0``,
honoured by the OpenAI, Anthropic and Groq SDKs), so :mod:`~aaa_django.llm.retry` is the
one policy: Pydantic AI's errors say the HTTP status and the server's ``Retry-After``.
Needs ``pip install 'aaa_django[pydantic-ai]'`` (plus the provider's own extra of
``pydantic-ai-slim``, e.g. ``pydantic-ai-slim[anthropic]``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Unpack

from .client import TextSink
from .messages import LLMRequest, Message, Usage
from .provider import ClientOptions, ProviderClient, ProviderResponse, classify_sdk_error, error_text, malformed
from .retry import AttemptFailed, Failure, reason_for_status, retry_after

if TYPE_CHECKING:  # an optional dependency: imported where it is used
    import httpx2
    from pydantic_ai.messages import ModelResponse
    from pydantic_ai.models import Model
    from pydantic_ai.providers import Provider


def _import() -> ModuleType:
    try:
        import pydantic_ai
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError(
            "PydanticAIClient needs the 'pydantic-ai-slim' package: pip install 'aaa_django[pydantic-ai]'"
        ) from None
    return pydantic_ai


class _LoopModels:
    """The models built for one event loop, and the HTTP client they share."""

    def __init__(self, client: PydanticAIClient) -> None:
        self.client = client
        self.models: dict[str | None, Model] = {}
        self.http: httpx2.AsyncClient | None = None

    def get(self, name: str | None) -> Model:
        model = self.models.get(name)
        if model is None:
            model = self.models[name] = self.client.build(name, self)
        return model

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()


class PydanticAIClient(ProviderClient[_LoopModels]):
    """An :class:`~aaa_django.llm.client.LLMClient` over a Pydantic AI ``Model``; see the
    module docstring. ``timeout`` bounds each attempt (seconds); ``max_retries``
    transient failures are retried; ``pricing`` is ``{model: {"input", "output"}}`` in
    dollars per million tokens, looked up by the name the provider answered with, then
    by the name asked for (without its ``provider:`` prefix, then with it)."""

    provider = "pydantic-ai"

    def __init__(
        self,
        model: Model | str | Callable[[], Model],
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        self._pai = _import()
        from pydantic_ai.models import Model

        self._instance = model if isinstance(model, Model) else None
        self._factory: Callable[[], Model] | None = model if callable(model) and self._instance is None else None
        name = model if isinstance(model, str) else _model_name(self._instance)
        super().__init__(base_url=base_url, api_key=api_key, model=name, **options)
        if self._instance is None and self._factory is None and not isinstance(model, str):
            raise TypeError(f"model must be a Pydantic AI Model, a model name or a factory, not {model!r}")

    # -- the models ------------------------------------------------------------------------

    def make_sdk(self) -> _LoopModels:
        return _LoopModels(self)

    def build(self, name: str | None, loop_models: _LoopModels) -> Model:
        """A ``Model`` for ``name`` (None: the client's own) on the running loop."""
        from pydantic_ai.models import infer_model

        if name is None or name == self.model:
            if self._instance is not None:
                return self._instance
            if self._factory is not None:
                return self._factory()
            name = self.model
        assert name is not None

        def provider(provider_name: str) -> Provider[Any]:
            from pydantic_ai.providers import infer_provider, infer_provider_class

            if self.base_url is None and not self._api_key:
                return infer_provider(provider_name)
            import httpx2

            if loop_models.http is None:
                loop_models.http = httpx2.AsyncClient()
            kwargs: dict[str, Any] = {"http_client": loop_models.http}
            if self.base_url is not None:
                kwargs["base_url"] = self.base_url
            if self._api_key:
                kwargs["api_key"] = self._api_key.reveal()
            return infer_provider_class(provider_name)(**kwargs)

        return infer_model(name, provider_factory=provider)

    # -- one attempt -----------------------------------------------------------------------

    def payload(self, request: LLMRequest, model: str) -> dict[str, Any]:
        from .pydantic_ai_messages import (
            to_model_messages,
            to_model_settings,
            to_request_parameters,
        )

        settings = to_model_settings(request.params)
        settings["max_retries"] = 0  # ours is the one retry policy
        if self.timeout is not None:
            settings.setdefault("timeout", self.timeout)
        return {
            "name": None if request.model in (None, self.model) else request.model,
            "messages": to_model_messages(request.messages),
            "settings": settings,
            "parameters": to_request_parameters(request.tools, request.output),
        }

    async def complete(self, request: LLMRequest) -> ProviderResponse:
        await self._built(request)
        return await super().complete(request)

    async def stream(self, request: LLMRequest, on_text: TextSink) -> ProviderResponse:
        await self._built(request)
        return await super().stream(request, on_text)

    async def _built(self, request: LLMRequest) -> None:
        """The request's model built before the first attempt, so building (imports,
        TLS setup) is not timed as one."""
        models = await self._sdk()
        if self.model is None:  # a factory's model names itself once built
            self.model = _model_name(models.get(None))
        models.get(None if request.model in (None, self.model) else request.model)

    async def send(self, sdk: _LoopModels, payload: dict[str, Any]) -> ModelResponse:
        from pydantic_ai.direct import model_request

        return await model_request(
            sdk.get(payload["name"]),
            payload["messages"],
            model_settings=payload["settings"],
            model_request_parameters=payload["parameters"],
        )

    async def send_streaming(
        self, sdk: _LoopModels, payload: dict[str, Any], on_text: Callable[[str], None]
    ) -> ModelResponse:
        from pydantic_ai.direct import model_request_stream
        from pydantic_ai.messages import PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta

        model = sdk.get(payload["name"])
        if not streams(model):  # a FunctionModel without a stream function: the reply whole
            return await self.send(sdk, payload)
        async with model_request_stream(
            model,
            payload["messages"],
            model_settings=payload["settings"],
            model_request_parameters=payload["parameters"],
        ) as stream:
            async for event in stream:
                if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    on_text(event.part.content)
                elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                    on_text(event.delta.content_delta)
            return stream.get()

    def parse(self, raw: object) -> tuple[Message, Usage, str | None, str | None]:
        from pydantic_ai.messages import ModelResponse

        from .pydantic_ai_messages import BadToolArguments, from_model_response

        if not isinstance(raw, ModelResponse):
            raise malformed(f"the model answered {type(raw).__name__}, not a ModelResponse")
        try:
            return from_model_response(raw)
        except BadToolArguments as exc:
            raise AttemptFailed(Failure("bad_tool_arguments", str(exc))) from None

    def classify(self, exc: BaseException) -> Failure | None:
        from pydantic_ai import exceptions as px

        if isinstance(exc, px.ModelHTTPError):
            status = exc.status_code
            wait = exc.retry_after if exc.retry_after is not None else retry_after(exc.headers)
            return Failure(
                reason_for_status(status), error_text(exc.body, f"HTTP {status}"), status=status, retry_after=wait
            )
        if isinstance(exc, (px.ModelTimeoutError, px.ModelRequestTimeout)):
            return Failure("timeout", f"no complete answer within {self.timeout}s")
        if isinstance(exc, px.ModelConnectionError):
            root = _root_cause(exc)
            detail = f" ({type(root).__name__}: {root})" if root is not exc else ""
            return Failure("connection", f"{exc.message}{detail}")
        if isinstance(exc, px.ModelRateLimitError):
            return Failure("rate_limit", exc.message, retry_after=exc.retry_after)
        if isinstance(exc, (px.ModelServerError, px.ModelUnavailableError)):
            return Failure("server_error", exc.message, retry_after=exc.retry_after)
        if isinstance(exc, px.ModelAuthenticationError):
            return Failure("auth", exc.message)
        if isinstance(exc, px.UnexpectedModelBehavior) or isinstance(_root_cause(exc), json.JSONDecodeError):
            return Failure("malformed_response", f"the reply does not match the API: {exc}")
        if isinstance(exc, (px.ModelAPIError, px.UserError)):
            return Failure("client_error", str(exc))
        return _sdk_failure(exc, self.timeout)

    def price_names(self, answered: str | None, model: str) -> tuple[str | None, ...]:
        """A name as asked (``openai:gpt-4o-mini``) is priced without its provider too."""
        bare = model.split(":", 1)[1] if ":" in model else None
        return answered, bare, model


def streams(model: Model) -> bool:
    """Whether ``model`` can stream a reply: every Pydantic AI model but a
    ``FunctionModel`` given no ``stream_function``."""
    from pydantic_ai.models.function import FunctionModel

    return not isinstance(model, FunctionModel) or model.stream_function is not None


def _model_name(model: Model | None) -> str | None:
    if model is None:
        return None
    name = model.model_name
    return name if isinstance(name, str) and name else None


def _root_cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _sdk_failure(exc: BaseException, timeout: float | None) -> Failure | None:
    """An SDK error Pydantic AI let through unwrapped (its adapters wrap most)."""
    try:
        import openai
    except ImportError:  # pragma: no cover
        return None
    return classify_sdk_error(openai, openai.OpenAIError, exc, timeout)
