"""How the Celery bus enqueues its deliveries: the message ``send_task`` sends, for less.

Every hop of a run in a cluster is one ``aaa.deliver`` message, sent by the process
that appended the event (a worker, or the web process for a run's start). Celery's
``app.send_task`` sends it through Celery's routing, retry policy and signals and a
producer taken from the app's pool for each message.

:class:`FastPublisher` sends the same message with less work, through Celery's and
kombu's documented interfaces: Celery builds it (``app.amqp.create_task_message``,
what ``send_task`` calls), and a kombu producer of the publisher's own publishes it
(``Producer.publish``). Routing is resolved once per queue. Measured with
``benchmarks/bench_concurrency.py --without fast-publish`` (200 runs x 3 model calls
of 1 s on one worker ``-c 2``, three repetitions, paired): without it the worker
processes spend 1.12x the CPU (1.00-1.21x); the wall time is within the noise of a
shared machine (0.81x, 0.81-1.36x).

It steps aside (``send`` returns False and the caller uses ``send_task``) whenever the
result could differ from what ``send_task`` would send: a broker other than Redis, a
route for ``aaa.deliver`` or an option of the task itself that sets more than its
queue, priority inherited from the sending task, a queue on a non-direct
exchange or with a priority, a compressed or v1 task protocol, "task-sent" events, or
any receiver of ``before_task_publish`` / ``after_task_publish`` (tracing integrations
see every message). After a failed publish it closes its connection and steps aside
for that message, so ``send_task``'s retry policy takes over. ``AAA["CELERY_FAST_PUBLISH"]
= False`` turns it off.

Not thread-safe: one publisher per sending thread (``DistributedBus.publisher``).
``tests/celery/test_publish.py`` checks its messages against ``send_task``'s.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals
from kombu.utils.uuid import uuid

log = logging.getLogger("aaa_django.bus")

#: option keys a route may give that only say where the message goes
_WHERE = frozenset({"queue", "exchange", "routing_key", "exchange_type"})


class FastPublisher:
    """Publishes task messages of ``app`` (see the module docstring)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._producer: Any = None
        #: queue name -> (kombu Queue, delivery_mode), or None: not plain, use send_task
        self._routes: dict[str, tuple[Any, Any] | None] = {}
        self._usable: bool | None = None
        #: queue name -> its kombu Queue bound to the producer's channel (declared once)
        self._bound: dict[str, Any] = {}
        #: messages sent, and messages left to send_task
        self.sent = 0
        self.declined = 0

    def usable(self) -> bool:
        """Is the app's configuration one this publisher reproduces exactly?"""
        if self._usable is None:
            conf = self.app.conf
            try:
                with self.app.connection_for_write() as conn:
                    driver = conn.transport.driver_type
            except Exception:  # an unknown transport: leave it to Celery
                driver = None
            self._usable = (
                driver == "redis"
                and int(conf.task_protocol or 2) == 2
                and not conf.task_compression
                and conf.task_default_priority is None
                and not conf.task_send_sent_event
            )
        return self._usable

    def _route(self, name: str, queue: str) -> tuple[Any, Any] | None:
        if queue not in self._routes:
            self._routes[queue] = self._plain_route(name, queue)
        return self._routes[queue]

    def _plain_route(self, name: str, queue: str) -> tuple[Any, Any] | None:
        """The kombu queue and delivery mode ``send_task`` would use, when its route
        to ``queue``, and the task's own options, set nothing but where the message
        goes; else None."""
        task = self.app.tasks.get(name)
        if task is not None and any(
            v is not None and k not in _WHERE and not (k == "serializer" and v == self.app.conf.task_serializer)
            for k, v in _exec_options(task).items()
        ):
            return None  # e.g. a priority or time limit the task sets: send_task adds it
        amqp = self.app.amqp
        options = amqp.router.route({"queue": queue}, name, (), {}, None)
        if set(options) - _WHERE:
            return None
        q = options.get("queue")
        if q is None or getattr(q, "name", q) != queue or isinstance(q, str):
            return None
        exchange = q.exchange
        if (exchange.type or "direct") != "direct" or q.queue_arguments or q.max_priority:
            return None
        if options.get("exchange") or options.get("routing_key"):
            return None  # an explicit exchange: let Celery route it
        mode = exchange.delivery_mode or self.app.conf.task_default_delivery_mode
        return q, mode

    def send(
        self, name: str, args: list[object], queue: str, argsrepr: str, extra_headers: dict[str, str] | None = None
    ) -> bool:
        """Publish task ``name`` with ``args`` to ``queue`` (and ``extra_headers``, as
        ``send_task(headers=...)`` adds them); False: not sent, use ``send_task``
        (this configuration or this moment is not one for it)."""
        route = self._route(name, queue) if self.usable() else None
        if route is None or signals.before_task_publish.receivers or signals.after_task_publish.receivers:
            self.declined += 1
            return False
        q, mode = route
        app = self.app
        parent = app.current_worker_task  # sent from inside a task: its ids, as send_task does
        if parent is not None and app.conf.task_inherit_parent_priority:
            self.declined += 1
            return False
        task_id = _uuid()
        headers, properties, body, _ = app.amqp.create_task_message(
            task_id,
            name,
            args,
            {},
            reply_to=app.thread_oid,
            argsrepr=argsrepr,
            kwargsrepr="{}",
            ignore_result=True,
            root_id=(parent.request.root_id or parent.request.id) if parent is not None else None,
            parent_id=parent.request.id if parent is not None else None,
        )
        if extra_headers:
            headers.update(extra_headers)
        try:
            producer = self._get_producer()
            bound = self._bound.get(queue)
            if bound is None:  # (kombu binds an unbound queue anew on every publish)
                bound = self._bound[queue] = q.bind(producer.channel)
            producer.publish(
                body,
                exchange="",
                routing_key=queue,
                serializer=app.conf.task_serializer,
                delivery_mode=mode,
                declare=[bound],
                headers=headers,
                retry=False,
                **properties,
                # (send_task passes them on as message properties too)
                argsrepr=argsrepr,
                kwargsrepr="{}",
            )
        except Exception:
            log.warning("fast publish to %s failed; sending through send_task", queue, exc_info=True)
            self.close()
            self.declined += 1
            return False
        self.sent += 1
        return True

    def _get_producer(self) -> Any:
        if self._producer is None:
            conn = self.app.connection_for_write()
            self._producer = self.app.amqp.Producer(conn, auto_declare=False)
        return self._producer

    def close(self) -> None:
        self._bound.clear()
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.connection.release()
            except Exception:
                log.debug("closing the fast publisher's connection failed", exc_info=True)


#: the options of a task that ``send_task`` applies to its messages (Celery's
#: ``Task`` attributes of those names)
_EXEC_OPTIONS = (
    "queue",
    "routing_key",
    "exchange",
    "priority",
    "expires",
    "serializer",
    "delivery_mode",
    "compression",
    "time_limit",
    "soft_time_limit",
)


def _exec_options(task: Any) -> dict[str, Any]:
    return {name: getattr(task, name, None) for name in _EXEC_OPTIONS}


def _uuid() -> str:
    return uuid()
