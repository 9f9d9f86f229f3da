"""aaa_django: an event-sourced runtime for LLM agent runs, as a reusable Django app.

The core packages (events, data, runtime, llm, tools, validate, algos) are pure Python
and import no Django; the modules beside them (apps, conf, checks, models, ...) are the
Django adapters. Importing this package imports nothing else, so the core can be used
without Django configured.
"""

__version__ = "0.1.0"
