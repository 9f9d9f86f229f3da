"""What a model attempt may cost, known before it is sent.

Every attempt is on the run's log (``aaa.llm.attempted``) before the provider sees it,
with an *estimate*: what it costs at most if its reply never comes back (its process
died with it in flight, or the run ended first). That estimate is what the run's spend
and budgets count for an attempt recorded abandoned, or cut off by the run's end:

- input tokens: the characters of the whole conversation sent (messages, tool calls'
  arguments, the tools' schemas), a token for every :data:`CHARS_PER_TOKEN` of them
  (rounded up): an English-text rule of thumb, not the provider's tokenizer;
- output tokens: the reply's limit, the request's ``params`` ``max_tokens`` (or
  ``max_completion_tokens``, ``max_output_tokens``), else the client's own
  (``AnthropicClient(max_tokens=...)``), else the handler's assumption
  (``LLMHandler(assumed_max_tokens=...)``, :data:`ASSUMED_MAX_TOKENS` by default);
- cost: those tokens priced by the client's table (a provider client's ``pricing``,
  the fake client's per-token prices); 0 for a client without prices.

The client's capabilities are declared as Protocols and detected once
(:class:`Estimator`, built where the handler is made).
"""

from __future__ import annotations

import json
import math
from typing import Protocol, runtime_checkable

from aaa_django.data.jsonvalue import JSONObject

from .messages import LLMRequest, Usage
from .pricing import Pricing

#: characters counted as one token in an estimate
CHARS_PER_TOKEN = 4
#: the reply's limit an estimate assumes when neither the request nor the client sets one
ASSUMED_MAX_TOKENS = 4096
#: request ``params`` that limit a reply's tokens, as providers name them
LIMIT_PARAMS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@runtime_checkable
class TablePriced(Protocol):
    """A client priced by a :class:`~aaa_django.llm.pricing.Pricing` table (the provider
    clients): ``pricing``, its default ``model``, and the names a reply is priced by."""

    model: str | None
    pricing: Pricing

    def price_names(self, answered: str | None, model: str) -> tuple[str | None, ...]: ...


@runtime_checkable
class PricedPerToken(Protocol):
    """A client with a price per token (the fake client: ``price_in``, ``price_out``, $)."""

    price_in: float
    price_out: float


@runtime_checkable
class NamesModel(Protocol):
    """A client with a default model (asked when a request names none)."""

    model: str | None


@runtime_checkable
class LimitsReplies(Protocol):
    """A client that sends a reply limit of its own when a request gives none."""

    max_tokens: int


class Estimator:
    """The estimate of an attempt of ``client`` (see the module docstring)."""

    def __init__(self, client: object, *, assumed_max_tokens: int = ASSUMED_MAX_TOKENS) -> None:
        self.assumed_max_tokens = assumed_max_tokens
        self.table: TablePriced | None = client if isinstance(client, TablePriced) else None
        self.per_token: PricedPerToken | None = client if isinstance(client, PricedPerToken) else None
        self.limits: LimitsReplies | None = client if isinstance(client, LimitsReplies) else None
        self.names: NamesModel | None = client if isinstance(client, NamesModel) else None

    def model(self, request: LLMRequest) -> str | None:
        """The model ``request`` asks: its own, else the client's default."""
        if request.model:
            return request.model
        default = self.names.model if self.names is not None else None
        return default if isinstance(default, str) else None

    def reply_limit(self, request: LLMRequest) -> int:
        """The most tokens the reply may have."""
        for key in LIMIT_PARAMS:
            value = (request.params or {}).get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        if self.limits is not None and isinstance(self.limits.max_tokens, int) and self.limits.max_tokens > 0:
            return self.limits.max_tokens
        return self.assumed_max_tokens

    def estimate(self, request: LLMRequest) -> JSONObject:
        """``{"usage": {"input_tokens", "output_tokens"}, "cost"}`` of an attempt at most
        (``"priced": false`` too when the client has no price for its model)."""
        usage = Usage(
            input_tokens=math.ceil(prompt_chars(request) / CHARS_PER_TOKEN), output_tokens=self.reply_limit(request)
        )
        out: JSONObject = {"usage": usage.model_dump()}
        if self.table is not None:
            model = self.model(request)
            cost = self.table.pricing.cost(usage, *self.table.price_names(None, model)) if model else None
            out["cost"] = cost.usd if cost is not None else 0.0
            if cost is None or not cost.priced:
                out["priced"] = False
        elif self.per_token is not None:
            out["cost"] = round(
                usage.input_tokens * self.per_token.price_in + usage.output_tokens * self.per_token.price_out, 12
            )
        else:
            out["cost"] = 0.0
            out["priced"] = False
        return out


def prompt_chars(request: LLMRequest) -> int:
    """Characters of what a request sends: the messages' text, their tool calls' names
    and arguments, the tools' schemas."""
    n = 0
    for m in request.messages:
        n += len(m.content or "")
        for c in m.tool_calls:
            n += len(c.name) + len(json.dumps(c.arguments, separators=(",", ":")))
    if request.tools:
        n += len(json.dumps(request.tools, separators=(",", ":")))
    return n
