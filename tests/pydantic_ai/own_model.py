"""An agent with a model of its own, and a tool: ``tests.pydantic_ai.own_model:agent``.

Its model is Anthropic's Messages API on a model server of its own
(tests/field/model_server.py): the one at ``AAA_TEST_AGENT_MODEL_URL`` (a Celery worker
is given the pytest process's), else one this module starts in a thread of the process
when it is imported (:data:`SERVER`: what it was asked).
"""

from __future__ import annotations

import os

from pydantic_ai import Agent
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.providers.anthropic import AnthropicProvider

from tests.field.model_server import ModelServer

SERVER = None if os.environ.get("AAA_TEST_AGENT_MODEL_URL") else ModelServer().__enter__()
URL = os.environ.get("AAA_TEST_AGENT_MODEL_URL") or (SERVER.url if SERVER is not None else "")

agent = Agent(
    AnthropicModel("own-model", provider=AnthropicProvider(base_url=URL, api_key="sk-agent-own")),
    instructions="Use the tools.",
)


@agent.tool_plain
def shout(text: str) -> str:
    """The text, loud."""
    return text.upper() + "!"


#: an agent without a model: its runs are answered by the site's model client
modelless = Agent(instructions="Use the tools.")
