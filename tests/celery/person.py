"""A person on duty for the fault tests: an uncertain guarded call (its intent logged,
no result, the process that ran it killed) makes its run wait for a person to
reconcile it (``aaa_django.tools.reconcile``). The fault tests answer each such
question as a careful person would: from what really happened, which the guarded
tool ``record`` writes down (a row per execution, keyed by the call's idempotency
key): "it ran" or "it did not run"."""

from __future__ import annotations

import asyncio

from django.db import connections

from aaa_django.events import derive_id
from aaa_django.runtime.event_types import APPROVAL_REQUESTED
from aaa_django.tools.reconcile import reconcile

from .site import EXEC_TABLE


def _open_gates() -> list[tuple[str, str, str]]:
    """``(run id, gate id, tool request id)`` of the reconciliation gates not answered
    yet, and whether each call ran. Its own connection, closed after (a thread of the
    loop's executor)."""
    try:
        with connections["postgres"].cursor() as cur:
            cur.execute(
                "SELECT g.stream, g.id, g.causation FROM aaa_event g WHERE g.type = %s "
                "AND g.data LIKE %s AND NOT EXISTS (SELECT 1 FROM aaa_event d WHERE d.causation = g.id)",
                [APPROVAL_REQUESTED, '%"reconcile"%'],
            )
            return list(cur.fetchall())
    finally:
        connections["postgres"].close()


def _ran(keys: list[str]) -> set[str]:
    try:
        with connections["postgres"].cursor() as cur:
            cur.execute(f"SELECT DISTINCT key FROM {EXEC_TABLE} WHERE key = ANY(%s)", [keys])
            return {k for (k,) in cur.fetchall()}
    finally:
        connections["postgres"].close()


async def reconciling(engine, stop: asyncio.Event, answered: dict[str, str], every: float = 0.5) -> None:
    """Until ``stop``: answer each open reconciliation gate with what happened ("ran" or
    "not_run"); ``answered``: gate id -> the answer given."""
    while not stop.is_set():
        gates = [g for g in await asyncio.to_thread(_open_gates) if g[1] not in answered]
        if gates:
            keys = {g[2]: derive_id(g[2], "aaa.idempotency") for g in gates}
            ran = await asyncio.to_thread(_ran, list(keys.values()))
            for run_id, gate, request in gates:
                verdict = "ran" if keys[request] in ran else "not_run"
                if await reconcile(
                    engine, run_id, gate, verdict, by="the test's person on duty", result="recorded (reconciled)"
                ):
                    answered[gate] = verdict
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass
