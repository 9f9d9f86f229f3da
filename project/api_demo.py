"""The example site's model and tools for the REST API demo: a SCRIPTED model.

No model provider is configured or called. ``scripted_model()`` returns a
FakeLLMClient that follows a fixed script whatever the task says, with the tools it is
offered, as a real model would: look up the populations of Lyon and Porto with
``lookup_population``, ask to publish the sum with ``publish_answer`` (a tool that
needs an approval, so the approval endpoints have something to answer), then reply
with the sum. A tool it is not offered it does not call: without
``lookup_population`` it answers that it cannot look anything up; without
``publish_answer`` it replies with the sum at once. A run's tools are the site's
unless its config names some (``config.tools``). Settings: ``AAA["LLM_CLIENT"]`` and
``AAA["TOOLS"]`` in ``project/settings.py``.
"""

from __future__ import annotations

from aaa_django.llm import FakeLLMClient
from aaa_django.llm.fake import text, tool_call
from aaa_django.tools import tool

POPULATIONS = {"Lyon": 522_250, "Porto": 231_800}


@tool(inline=True)
def lookup_population(city: str) -> int:
    """The population of a city (a canned table: this is a demo tool).

    Args:
        city: Lyon or Porto.
    """
    if city not in POPULATIONS:
        raise ValueError(f"no population known for {city!r}")
    return POPULATIONS[city]


@tool(requires_approval=True, inline=True)
def publish_answer(text: str) -> str:
    """Publish an answer (needs a person's approval; publishes nothing: a demo).

    Args:
        text: the answer to publish.
    """
    return f"published: {text}"


def _script(request):
    offered = {t["name"] for t in request.tools}
    results = [m for m in request.messages if m.role == "tool"]
    cities = list(POPULATIONS)
    if "lookup_population" not in offered and not results:
        return text("I was offered no tool to look populations up with, so I cannot answer.")
    if len(results) < len(cities):
        return tool_call("lookup_population", city=cities[len(results)])
    total = sum(int(m.content) for m in results[: len(cities)] if (m.content or "").isdigit())
    answer = f"Lyon and Porto have {total:,} inhabitants together."
    if len(results) == len(cities) and "publish_answer" in offered:
        return tool_call("publish_answer", text=answer)
    if len(results) == len(cities):
        return text(answer)
    return text(answer + " (" + (results[-1].content or "") + ")")


def scripted_model():
    """The LLM_CLIENT factory: the provider of ``AAA["LLM"]`` when the environment
    configures one, else a scripted FakeLLMClient (no provider is called)."""
    from aaa_django.site.llm_settings import client_from_settings

    return client_from_settings() or FakeLLMClient(_script)
