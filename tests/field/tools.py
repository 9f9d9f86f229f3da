"""Tools the field tests give the example site (``AAA_EXTRA_TOOLS``)."""

from __future__ import annotations

import asyncio
import json
import os
import time

from aaa_django.tools import tool


@tool(side_effects=True)
async def slow_charge(city: str, idempotency_key: str = "") -> str:
    """Charges a city's account: a side effect that must happen at most once per call.
    Each execution is a line in the file ``AAA_TEST_CHARGES`` (its key, the process, the
    time), written when it starts; it then works for ``AAA_TEST_CHARGE_SECONDS``, and
    returns only once the file ``AAA_TEST_CHARGE_HOLD`` (if named) is gone: a test holds
    the calls in flight while it breaks things.

    Args:
        city: the city to charge.
    """
    with open(os.environ["AAA_TEST_CHARGES"], "a") as f:
        f.write(json.dumps({"key": idempotency_key, "city": city, "pid": os.getpid(), "at": time.time()}) + "\n")
    await asyncio.sleep(float(os.environ.get("AAA_TEST_CHARGE_SECONDS", "1")))
    hold = os.environ.get("AAA_TEST_CHARGE_HOLD")
    while hold and os.path.exists(hold):
        await asyncio.sleep(0.1)
    return f"charged {city}"


def executions(path: str) -> list[dict]:
    """The executions ``slow_charge`` recorded in ``path``."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
