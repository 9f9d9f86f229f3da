"""``ProviderClient``: what the real model clients share.

A subclass maps our messages to its provider's request (:meth:`payload`), sends it
with the provider's SDK (:meth:`send`), reads the reply (:meth:`parse`) and
classifies the SDK's exceptions (:meth:`classify`). This base does the rest, the same
way for every provider: the retry policy (:mod:`~aaa_django.llm.retry`), usage and
cost (:mod:`~aaa_django.llm.pricing`), keeping the API key out of every message and
repr, and one SDK client per event loop.

Why per loop: an SDK client's pooled connections belong to the event loop that
opened them, and building one costs tens of milliseconds (TLS setup), so each loop
gets one, reused for every call on it. A client whose loop has closed is closed
when another loop next uses this client; ``await client.aclose()`` (or ``async
with client:``) closes the current loop's one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from types import ModuleType
from typing import Any, ClassVar, Generic, NoReturn, Protocol, TypedDict, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field

from aaa_django.data.jsonvalue import JSONObject

from .client import TextSink
from .messages import LLMRequest, LLMResponse, Message, Usage
from .pricing import Pricing, as_pricing
from .retry import (
    AttemptFailed,
    Backoff,
    Failure,
    call_with_retries,
    reason_for_status,
    retry_after,
)

log = logging.getLogger("aaa_django.llm")

#: request parameters the client sets itself; ``LLMRequest.params`` may not override them
RESERVED_PARAMS = frozenset({"model", "messages", "tools", "system", "stream"})


class ClientOptions(TypedDict, total=False):
    """What every provider client takes beside its endpoint, key and model (the
    keywords of :class:`ProviderClient`, the one constructor they share)."""

    #: seconds one HTTP attempt may take (None: no limit)
    timeout: float | None
    #: transient failures retried
    max_retries: int
    #: ``{model: {"input": $/1M tokens, "output": $/1M tokens}}``
    pricing: Pricing | Mapping[str, Mapping[str, object]] | None
    backoff: Backoff | None
    #: how the client waits between attempts (a test records the delays instead)
    sleep: Callable[[float], Awaitable[object]] | None


class ProviderResponse(LLMResponse):
    """An :class:`LLMResponse` with what the provider clients know besides: every
    HTTP attempt made for it, and whether its model was in the pricing table."""

    attempts: list[dict[str, Any]] = Field(default_factory=list)


class Secret:
    """A string that never shows itself in a repr, a str or a log line."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def reveal(self) -> str | None:
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret(None)"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is not pickled")


def safe_url(url: str | None) -> str | None:
    """``url`` without a user name or password in it."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class SDKClient(Protocol):
    """A vendor SDK's client, as a provider client keeps one per event loop."""

    def close(self) -> Awaitable[object]: ...


SDK = TypeVar("SDK", bound=SDKClient)


class ProviderClient(Generic[SDK]):
    """Base of the provider clients: see the module docstring. ``SDK``: the type of
    the vendor SDK's client it makes (:meth:`make_sdk`), one per event loop."""

    #: the provider's name in errors and logs
    provider: ClassVar[str] = "provider"

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        model: str | None,
        timeout: float | None = 60.0,
        max_retries: int = 2,
        pricing: Pricing | Mapping[str, Mapping[str, object]] | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[object]] | None = None,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self.base_url = base_url or None
        self.model = model or None
        self.timeout = timeout
        self.max_retries = max_retries
        self.pricing = as_pricing(pricing)
        self.backoff = backoff or Backoff()
        #: how the client waits between attempts (a test records the delays instead)
        self.sleep = sleep or asyncio.sleep
        #: headers sent with every request (an SDK client's ``default_headers``)
        self.default_headers = dict(default_headers or {})
        self._api_key = Secret(api_key)
        # kept wrapped, so vars(client) or a debugger's dump shows no key either
        self._secrets = [Secret(s) for s in (api_key, _url_password(base_url)) if s and len(s) >= 4]
        self._sdks: dict[asyncio.AbstractEventLoop, SDK] = {}
        self._unpriced_warned: set[str] = set()

    def prices(self, model: str | None) -> bool:
        """Whether calls to ``model`` (None: the client's own) have a price
        (:class:`~aaa_django.llm.client.PricedClient`)."""
        name = model or self.model
        # the names a reply would be priced by, before any reply (a provider's own rules)
        return name is not None and self.pricing.price(*self.price_names(None, name)) is not None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(base_url={safe_url(self.base_url)!r}, model={self.model!r}, "
            f"timeout={self.timeout!r}, max_retries={self.max_retries!r})"
        )

    # -- what a provider implements ------------------------------------------------------

    def sdk_options(self) -> dict[str, Any]:
        """The keywords of a vendor SDK's client (OpenAI's, Anthropic's): the endpoint,
        key, timeout and headers of this client, and no retries of the SDK's own."""
        return {
            "base_url": self.base_url,
            "api_key": self._api_key.reveal(),
            "timeout": self.timeout,
            "max_retries": 0,  # ours is the one retry policy
            "default_headers": self.default_headers or None,
        }

    def make_sdk(self) -> SDK:  # pragma: no cover - abstract
        """A new SDK client (its own retries off: ``max_retries=0``)."""
        raise NotImplementedError

    def payload(self, request: LLMRequest, model: str) -> dict[str, Any]:  # pragma: no cover
        """The SDK call's keyword arguments for ``request`` (pure)."""
        raise NotImplementedError

    async def send(self, sdk: SDK, payload: dict[str, Any]) -> object:  # pragma: no cover
        raise NotImplementedError

    async def send_streaming(
        self, sdk: SDK, payload: dict[str, Any], on_text: Callable[[str], None]
    ) -> object:  # pragma: no cover
        """Send ``payload`` asking for a stream, call ``on_text`` with each piece of
        text, and return the whole reply as :meth:`parse` reads it."""
        raise NotImplementedError

    def parse(self, raw: object) -> tuple[Message, Usage, str | None, str | None]:  # pragma: no cover
        """(message, usage, model answered, finish reason); raises :class:`AttemptFailed`."""
        raise NotImplementedError

    def classify(self, exc: BaseException) -> Failure | None:  # pragma: no cover
        """The failure an SDK exception stands for (None: not a call failure)."""
        raise NotImplementedError

    # -- the call --------------------------------------------------------------------------

    async def complete(self, request: LLMRequest) -> ProviderResponse:
        """Send the whole conversation; return the reply with its usage, cost and
        attempts. Raises :class:`~aaa_django.llm.errors.LLMCallError`."""
        return await self._call(request, None)

    async def stream(self, request: LLMRequest, on_text: TextSink) -> ProviderResponse:
        """As :meth:`complete`, streamed: ``on_text(index, text)`` gets each piece of
        the reply's text as it arrives (index 0 again: a retried attempt starts over)."""
        return await self._call(request, on_text)

    async def _call(self, request: LLMRequest, on_text: TextSink | None) -> ProviderResponse:
        model = request.model or self.model
        if not model:
            raise ValueError(f"{type(self).__name__}: no model: give one to the client or in the request")
        params = dict(request.params or {})
        clash = RESERVED_PARAMS & set(params)
        if clash:
            raise ValueError(f"request params may not set {sorted(clash)}: the client sets them")
        payload = self.payload(request, model)
        sdk = await self._sdk()

        async def attempt() -> tuple[Message, Usage, str | None, str | None]:
            if on_text is None:
                return self.parse(await self.send(sdk, payload))
            return self.parse(await self.send_streaming(sdk, payload, _counted(on_text)))

        (message, usage, answered, finish), attempts = await call_with_retries(
            attempt,
            self.classify,
            max_retries=self.max_retries,
            backoff=self.backoff,
            timeout=self.timeout,
            redact=self.redact,
            provider=self.provider,
            model=model,
            sleep=self.sleep,
        )
        cost = self.pricing.cost(usage, *self.price_names(answered, model))
        if not cost.priced and model not in self._unpriced_warned:
            self._unpriced_warned.add(model)
            log.warning(
                "no price for model %r (answered as %r): its calls cost 0 in budgets; add it to the pricing table",
                model,
                answered,
            )
        return ProviderResponse(
            message=message,
            usage=usage,
            cost=cost.usd,
            model=answered or model,
            finish_reason=finish,
            attempts=attempts,
            priced=cost.priced,
        )

    def price_names(self, answered: str | None, model: str) -> tuple[str | None, ...]:
        """The names a reply is priced by, first match wins: the one the provider
        answered with, then the one asked for."""
        return answered, model

    # -- secrets -----------------------------------------------------------------------------

    def add_secret(self, value: object) -> None:
        """Mask ``value`` too (a credential the SDK found by itself)."""
        if isinstance(value, str) and len(value) >= 4 and all(s.reveal() != value for s in self._secrets):
            self._secrets.append(Secret(value))

    def redact(self, text: str) -> str:
        """``text`` with the API key (and a password in the base URL) masked."""
        for secret in self._secrets:
            text = text.replace(secret.reveal() or "***", "***")
        return text

    # -- one SDK client per event loop -------------------------------------------------

    async def _sdk(self) -> SDK:
        loop = asyncio.get_running_loop()
        sdk = self._sdks.get(loop)
        if sdk is None:
            # registered before any await, so concurrent first calls share it
            sdk = self._sdks[loop] = self.make_sdk()
            await self._close(lambda other: other is not loop and other.is_closed())
        return sdk

    async def aclose(self) -> None:
        """Close the SDK client of the running loop (and of loops that have closed)."""
        loop = asyncio.get_running_loop()
        await self._close(lambda other: other is loop or other.is_closed())

    async def _close(self, which: Callable[[asyncio.AbstractEventLoop], bool]) -> None:
        for key in [other for other in self._sdks if which(other)]:
            sdk = self._sdks.pop(key, None)
            if sdk is not None:
                await _close_quietly(sdk)

    async def __aenter__(self) -> ProviderClient[SDK]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _counted(on_text: TextSink) -> Callable[[str], None]:
    """``on_text`` with the attempt's own count: each attempt's first piece is index 0;
    empty pieces (a role or usage chunk) are not passed on."""
    n = 0

    def sink(text: str) -> None:
        nonlocal n
        if text:
            on_text(n, text)
            n += 1

    return sink


async def _close_quietly(sdk: SDKClient) -> None:
    try:  # a client of a closed loop cannot close its sockets cleanly: it is marked closed
        await asyncio.wait_for(sdk.close(), 2)
    except Exception:
        pass


def _url_password(url: str | None) -> str | None:
    if not url:
        return None
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def classify_sdk_error(
    sdk: ModuleType, base: type[BaseException], exc: BaseException, timeout: float | None
) -> Failure | None:
    """One failure classification for the providers' SDKs: OpenAI's and Anthropic's are
    generated alike (``APITimeoutError``, ``APIConnectionError``, ``APIStatusError``...),
    so ``sdk`` is the SDK module and ``base`` its root error class."""
    if isinstance(exc, sdk.APITimeoutError):
        return Failure("timeout", f"no complete answer within {timeout}s")
    if isinstance(exc, sdk.APIConnectionError):
        cause, message = exc.__cause__, getattr(exc, "message", None) or "Connection error."
        return Failure("connection", f"{message} ({type(cause).__name__}: {cause})" if cause else message)
    if isinstance(exc, sdk.APIResponseValidationError):
        return Failure(
            "malformed_response",
            f"the reply does not match the API: {exc.message}",
            status=getattr(exc, "status_code", None),
        )
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        return Failure(
            reason_for_status(status),
            error_text(exc.body, f"HTTP {status}"),
            status=status,
            retry_after=retry_after(exc.response.headers),
        )
    if isinstance(exc, json.JSONDecodeError):
        return Failure("malformed_response", f"the reply is not valid JSON: {exc}")
    if isinstance(exc, base):
        return Failure("client_error", str(exc))
    return None


def error_text(body: object, default: str) -> str:
    """The human message in a provider's error body (``{"error": {"message": ...}}``
    and the like), else the body itself, else ``default``."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            msg = inner.get("message")
            kind = inner.get("type") or inner.get("code")
            if isinstance(msg, str) and msg:
                return f"{kind}: {msg}" if isinstance(kind, str) and kind else msg
        elif isinstance(inner, str) and inner:
            return inner
        msg = body.get("message")
        if isinstance(msg, str) and msg:
            return msg
    if isinstance(body, (str, bytes)) and body:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        return re.sub(r"<[^>]+>", " ", text)  # an HTML error page: its words
    return default


def malformed(why: str) -> AttemptFailed:
    return AttemptFailed(Failure("malformed_response", why))


def tool_arguments(raw: object, name: str) -> JSONObject:
    """A tool call's arguments as a dict: from a JSON string (OpenAI), a dict
    (Anthropic, some local servers) or nothing; else ``bad_tool_arguments``."""
    if raw is None or raw == "":
        return {}
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise AttemptFailed(
                Failure("bad_tool_arguments", f"the model's arguments for tool {name!r} are not JSON ({exc}): {raw!r}")
            ) from None
    if not isinstance(value, dict):
        raise AttemptFailed(
            Failure("bad_tool_arguments", f"the model's arguments for tool {name!r} are not a JSON object: {raw!r}")
        )
    return value


def token_count(value: object) -> int:
    """A token count from a usage block (0 when missing or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
