"""Log lines with their run: the event being delivered, for every log record (pure core).

The engine sets a context variable around each delivery (:meth:`Engine.observing`:
the in-process bus's ``handle`` and a Celery worker's delivery alike); what runs in
it, and every thread or task started from it, sees the event. Two logging helpers
read it, for the site's ``LOGGING``:

- :class:`DeliveryContext`, a ``logging.Filter`` for a handler: it gives each record
  ``run_id``, ``seq`` and ``event_type`` (None outside a delivery), so a format
  string may name them (``%(run_id)s``);
- :class:`JsonFormatter`: one JSON object per line, with those three fields when set.

Both are plain ``logging``: ``docs/observe.md#logs-with-context`` shows a ``LOGGING`` that
uses them.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
from dataclasses import asdict, dataclass

from aaa_django.events import Event


@dataclass(slots=True)
class Delivery:
    """What log records carry of the event being delivered (``event_type`` None: a
    bus's delivery that has not read its event yet)."""

    run_id: str
    seq: int | None
    event_type: str | None = None


#: the delivery running in this context, or None
_delivering: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar("aaa_delivering", default=None)

#: the record attributes :class:`DeliveryContext` sets
FIELDS = ("run_id", "seq", "event_type")


def delivering(event: Event) -> contextlib.AbstractContextManager[None]:
    """Within: log records carry ``event``'s run id, seq and type."""
    return _Within(event)


class _Within:
    """:func:`delivering`'s context manager (a class, not a generator: entered once per
    delivery, in a third of the time)."""

    __slots__ = ("event", "token")

    def __init__(self, event: Event) -> None:
        self.event = event

    def __enter__(self) -> None:
        event = self.event
        outer = _delivering.get()
        if outer is not None and outer.event_type is None and (outer.run_id, outer.seq) == (event.stream, event.seq):
            outer.event_type = event.type  # the bus's own lines about this delivery, from now on
        self.token = _delivering.set(Delivery(event.stream, event.seq, event.type))

    def __exit__(self, *exc: object) -> None:
        _delivering.reset(self.token)


def enter(delivery: Delivery) -> contextvars.Token:
    """Set the delivery for what follows in this context (a bus that knows the event
    before the engine reads it: a Celery task's message); :func:`leave` with the token."""
    return _delivering.set(delivery)


def leave(token: contextvars.Token) -> None:
    _delivering.reset(token)


def current() -> Delivery | None:
    """The delivery running in this context, if any."""
    return _delivering.get()


class DeliveryContext(logging.Filter):
    """Adds ``run_id``, ``seq`` and ``event_type`` of the event being delivered to
    each record (None outside a delivery); lets every record through. Attach it to a
    handler (``"filters": ["aaa"]``) so records of every logger get the fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        d = _delivering.get()
        if d is None:
            record.run_id = record.seq = record.event_type = None
        else:
            record.run_id, record.seq, record.event_type = d.run_id, d.seq, d.event_type
        return True


#: attributes every LogRecord has: not copied into the JSON as extras
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, the delivery's ``run_id``/``seq``/``event_type`` when in one,
    ``exc_info`` (the formatted traceback) when there is one, and any ``extra=``
    fields the call gave (values JSON cannot hold are written as ``str``)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = vars(record)
        if "run_id" in fields:  # set by DeliveryContext (perhaps in another thread: a QueueHandler)
            if fields["run_id"] is not None:
                out.update({f: fields.get(f) for f in FIELDS})
        elif (d := _delivering.get()) is not None:
            out.update(asdict(d))
        for key, value in fields.items():
            if key not in _STANDARD and key not in FIELDS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)
