"""``AgentModels``: one model client that answers each Pydantic AI agent with its own model.

A :class:`~aaa_django.algos.PydanticAIAgent` run's model requests name their agent
(``aaa.llm.requested`` ``"agent"``: its dotted path; not when the run's config names a
model, which the site's client is asked for instead). ``AgentModels(site, {path:
client})`` sends the requests of an agent it has a client for to that client (a
``PydanticAIClient`` over the agent's model), and every other request to ``site``::

    LLMHandler(AgentModels(client_from_settings(), {
        "myapp.agents:support": PydanticAIClient(support.model),
    })).attach(engine)

The site's wiring builds one from ``AAA["AGENTS"]`` (:func:`aaa_django.site.engines.attach_site_handlers`).
What the handler detects once (streaming, prices) is detected here once per client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from aaa_django.runtime import dotted

from .client import LLMClient, PricedClient, StreamingLLMClient, TextSink
from .messages import LLMRequest, LLMResponse


def agent_key(path: str) -> str:
    """An agent's path as requests name it: ``"package.module:name"`` (either way written)."""
    module, attr = dotted.split(path)
    return f"{module}:{attr}"


class AgentModels:
    """An :class:`~aaa_django.llm.client.LLMClient` (streaming, priced) that routes each
    request by its ``agent``; see the module docstring."""

    def __init__(self, default: LLMClient, agents: Mapping[str, LLMClient]) -> None:
        self.default = default
        self.agents = {agent_key(path): client for path, client in agents.items()}
        #: the clients that stream, and the default's prices (detected once)
        self._streaming = {id(c): c for c in (default, *self.agents.values()) if isinstance(c, StreamingLLMClient)}
        self._pricer = default if isinstance(default, PricedClient) else None
        #: the model a request that names none is sent to (the default client's)
        self.model: str | None = self._pricer.model if self._pricer is not None else None

    def route(self, agent: str | None) -> LLMClient:
        """The client that answers requests of ``agent`` (None: of no agent)."""
        if agent is None:
            return self.default
        return self.agents.get(agent_key(agent), self.default)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        return await self.route(request.agent).complete(request)

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse:
        client = self.route(request.agent)
        streaming = self._streaming.get(id(client))
        if streaming is None:
            return await client.complete(request)
        return await streaming.stream(request, on_text)

    def prices(self, model: str | None) -> bool:
        """Whether the default client has a price for ``model`` (True when it cannot
        tell: a client without a pricing table is never refused a cost budget)."""
        return self._pricer.prices(model) if self._pricer is not None else True

    def __repr__(self) -> str:
        return f"AgentModels({self.default!r}, agents={sorted(self.agents)})"

    async def aclose(self) -> None:
        """Close the running loop's SDK clients of every client that has them."""
        for client in (self.default, *self.agents.values()):
            if isinstance(client, Closes):
                await client.aclose()


@runtime_checkable
class Closes(Protocol):
    """A client with SDK connections to close (the provider clients)."""

    async def aclose(self) -> None: ...
