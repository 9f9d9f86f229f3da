"""The site's model provider, from ``settings.AAA["LLM"]`` (Django layer).

    AAA = {
        "LLM": {
            "PROVIDER": "openai",                  # or "anthropic", "pydantic-ai"
            "BASE_URL": "http://localhost:11434/v1",
            "API_KEY": os.environ.get("AAA_LLM_API_KEY"),
            "MODEL": "llama3.1:8b",
            "TIMEOUT": 60,                         # seconds per HTTP attempt
            "MAX_RETRIES": 2,                      # transient failures retried
            "PRICING": {"llama3.1:8b": {"input": 0, "output": 0}},  # $ per 1M tokens
        },
    }

==============  ================  =========  ============================================
Key             Type              Default    Meaning
==============  ================  =========  ============================================
PROVIDER        str               "openai"   "openai": any OpenAI-compatible server
                                             (OpenAI, vLLM, Ollama, LM Studio, llama.cpp);
                                             "anthropic": Anthropic's Messages API;
                                             "pydantic-ai": any model Pydantic AI reaches,
                                             MODEL in its "provider:model" form.
BASE_URL        str or None       None       The server's URL (OpenAI-compatible: ending
                                             in /v1). None: the provider's own.
API_KEY         str or None       None       The key. Read it from the environment or a
                                             secrets store; it is never written to events,
                                             errors or logs. None: no key (local servers).
MODEL           str               --         The model asked when a request names none.
                                             Required once anything else is set.
TIMEOUT         number > 0/None   60         Seconds one HTTP attempt may take.
MAX_RETRIES     int >= 0          2          Retries of a transient failure (429, 5xx,
                                             timeout, dropped connection).
PRICING         dict              {}         {model: {"input": $/1M tokens, "output":
                                             $/1M tokens}}; an unpriced model costs 0,
                                             is flagged "priced": false, and a cost
                                             budget over it is refused at start.
MAX_TOKENS      int >= 1          4096       Anthropic only: the reply limit when a
                                             request's params give none.
==============  ================  =========  ============================================

With no ``LLM`` key, or one whose ``BASE_URL``, ``API_KEY`` and ``MODEL`` are all
empty, nothing is configured: :func:`client_from_settings` returns None and the
caller chooses (the demo uses its scripted model and says so). The example site fills
this dict from ``AAA_LLM_PROVIDER``, ``AAA_LLM_BASE_URL``, ``AAA_LLM_API_KEY`` and
``AAA_LLM_MODEL``; the library itself reads no environment variable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Unpack

from django.apps import AppConfig
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured

from aaa_django.conf import site_aaa
from aaa_django.llm.anthropic_client import AnthropicClient
from aaa_django.llm.openai_client import OpenAICompatibleClient
from aaa_django.llm.pricing import Pricing
from aaa_django.llm.provider import ClientOptions, ProviderClient
from aaa_django.llm.pydantic_ai_client import PydanticAIClient

PROVIDERS = ("openai", "anthropic", "pydantic-ai")
#: the package each provider's client needs (the pip extra is named after the provider)
PACKAGES = {"openai": "openai", "anthropic": "anthropic", "pydantic-ai": "pydantic_ai"}
DEFAULTS: dict[str, Any] = {
    "PROVIDER": "openai",
    "BASE_URL": None,
    "API_KEY": None,
    "MODEL": None,
    "TIMEOUT": 60,
    "MAX_RETRIES": 2,
    "PRICING": {},
    "MAX_TOKENS": 4096,
}


def _raw() -> object:
    """``AAA["LLM"]`` as the site gives it (None: not given)."""
    site = site_aaa()
    return site.get("LLM") if isinstance(site, dict) else None


def llm_options() -> dict[str, Any] | None:
    """``AAA["LLM"]`` merged over :data:`DEFAULTS` and checked; None when no provider
    is configured. Raises ``ImproperlyConfigured`` with every problem found."""
    raw = _raw()
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"AAA['LLM'] must be a dict or None, not {type(raw).__name__}.")
    options = {**DEFAULTS, **raw}
    if not any(options[k] for k in ("BASE_URL", "API_KEY", "MODEL")):
        return None
    problems = _problems(raw, options)
    if problems:
        raise ImproperlyConfigured("AAA['LLM']: " + " ".join(problems))
    return options


def _problems(raw: dict[str, Any], o: dict[str, Any]) -> list[str]:
    problems = []
    unknown = sorted(set(raw) - set(DEFAULTS), key=str)
    if unknown:
        problems.append(f"unknown keys {unknown} (known: {', '.join(DEFAULTS)}).")
    if o["PROVIDER"] not in PROVIDERS:
        problems.append(f"PROVIDER must be one of {PROVIDERS}, not {o['PROVIDER']!r}.")
    for key in ("BASE_URL", "API_KEY"):
        if o[key] is not None and not isinstance(o[key], str):
            problems.append(f"{key} must be a str or None.")  # the value is not shown: it may be a secret
    if not isinstance(o["MODEL"], str) or not o["MODEL"]:
        problems.append("MODEL is required (the model a request without one is sent to).")
    t = o["TIMEOUT"]
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
        problems.append(f"TIMEOUT must be a number of seconds > 0 or None, not {t!r}.")
    for key, low in (("MAX_RETRIES", 0), ("MAX_TOKENS", 1)):
        v = o[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            problems.append(f"{key} must be an int >= {low}, not {v!r}.")
    if not isinstance(o["PRICING"], dict):
        problems.append("PRICING must be a dict {model: {'input': ..., 'output': ...}}.")
    else:
        try:
            Pricing(o["PRICING"])
        except ValueError as exc:
            problems.append(f"PRICING: {exc}.")
    return problems


def provider_client(
    provider: str,
    model: Any,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    max_tokens: int = DEFAULTS["MAX_TOKENS"],
    **options: Unpack[ClientOptions],
) -> ProviderClient:
    """The client of ``provider`` (one of :data:`PROVIDERS`) for ``model``: the one way
    the site builds a model client, from ``AAA["LLM"]`` (:func:`client_from_settings`),
    over an agent's own model (:func:`agent_clients`) and in the system checks.
    ``max_tokens``: Anthropic's reply limit; ``options`` as every client takes them
    (:func:`client_options`)."""
    if provider == "anthropic":
        return AnthropicClient(base_url, api_key, model, max_tokens=max_tokens, **options)
    if provider == "pydantic-ai":
        return PydanticAIClient(model, base_url=base_url, api_key=api_key, **options)
    return OpenAICompatibleClient(base_url, api_key, model, **options)


def client_from_settings() -> ProviderClient | None:
    """The configured provider's client (an ``LLMClient``), or None when the site
    configured none. Raises ``ImproperlyConfigured`` for a bad ``AAA["LLM"]`` and
    ``ImportError`` when the provider's SDK is not installed."""
    o = llm_options()
    if o is None:
        return None
    return provider_client(
        o["PROVIDER"],
        o["MODEL"],
        base_url=o["BASE_URL"],
        api_key=o["API_KEY"],
        max_tokens=o["MAX_TOKENS"],
        **client_options(),
    )


def client_options() -> ClientOptions:
    """``TIMEOUT``, ``MAX_RETRIES`` and ``PRICING`` of ``AAA["LLM"]`` (else their
    defaults) as a client's keywords: the site's client and the clients over its
    agents' own models (:func:`agent_clients`) share them, so ``PRICING`` is the one
    place prices are set."""
    raw = _raw()
    o = {**DEFAULTS, **(raw if isinstance(raw, dict) else {})}
    return {"timeout": o["TIMEOUT"], "max_retries": o["MAX_RETRIES"], "pricing": o["PRICING"]}


def agent_clients(agents: Iterable[tuple[str, Any]]) -> dict[str, ProviderClient]:
    """A ``PydanticAIClient`` over the model of each ``(path, agent)`` that has one of its
    own (``Agent(model, ...)``), by path: the agent's runs are answered by it
    (:class:`~aaa_django.llm.routes.AgentModels`). An agent without a model runs on
    the site's client."""
    return {
        path: provider_client("pydantic-ai", agent.model, **client_options())
        for path, agent in agents
        if agent.model is not None
    }


def check_llm_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error]:
    """System check ``aaa.E060``: ``AAA["LLM"]`` is malformed, or its provider's SDK
    is not installed."""
    try:
        o = llm_options()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint="See docs/models.md.", id="aaa.E060")]
    if o is None:
        return []
    package = PACKAGES[o["PROVIDER"]]
    try:
        __import__(package)
    except ImportError:
        return [
            Error(
                f"AAA['LLM'] uses PROVIDER {o['PROVIDER']!r}, but the {package!r} package is missing.",
                hint=f"pip install 'aaa_django[{o['PROVIDER']}]'",
                id="aaa.E060",
            )
        ]
    return []
