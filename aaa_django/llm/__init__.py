"""Model handlers and clients (pure core).

``LLMHandler(FakeLLMClient(model_fn)).attach(engine)``; replies for the fake are built
with :func:`aaa_django.llm.fake.text` and :func:`aaa_django.llm.fake.tool_call`.
"""

from .client import LLMClient
from .conversation import CONVERSATION, Conversation
from .fake import FakeLLMClient
from .handler import LLMHandler
from .messages import LLMRequest, LLMResponse, Message, ToolCall, Usage

__all__ = [
    "CONVERSATION",
    "Conversation",
    "FakeLLMClient",
    "LLMClient",
    "LLMHandler",
    "LLMRequest",
    "LLMResponse",
    "Message",
    "ToolCall",
    "Usage",
]
