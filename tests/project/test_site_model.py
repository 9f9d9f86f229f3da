"""The example site's model: scripted unless the environment names a provider."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _site_llm(extra_env: dict[str, str]) -> str:
    code = (
        "import django; django.setup();"
        "from project.api_demo import scripted_model;"
        "print(type(scripted_model()).__name__)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AAA_LLM_")}
    env.update(DJANGO_SETTINGS_MODULE="project.settings", **extra_env)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_example_site_uses_the_scripted_model_when_no_provider_is_configured():
    assert _site_llm({}) == "FakeLLMClient"


def test_the_example_site_uses_the_provider_the_environment_names():
    name = _site_llm(
        {"AAA_LLM_BASE_URL": "http://127.0.0.1:9/v1", "AAA_LLM_API_KEY": "sk-test", "AAA_LLM_MODEL": "some-model"}
    )
    assert name == "OpenAICompatibleClient"
