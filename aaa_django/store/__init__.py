"""Where the log is kept: the adapters of the core's ``EventStore``.

- :mod:`.database`: :class:`DjangoEventStore`, the log in the site's database (any
  backend Django has; the invariants enforced by the schema, ``migrations/0002``);
  its plain-SQL rows (:mod:`.rows`) and one-statement appends (:mod:`.appends`);
- :mod:`.runindex`: the run index (``aaa_run``), derived from the log in the same
  transaction as each append;
- :mod:`.postgres`: :class:`~aaa_django.store.postgres.PgEventStore`, the same log
  through psycopg's async connections (:mod:`.connections`, the runtime's own), with
  :mod:`.groupcommit` sharing one transaction between runs appending at once;
- :func:`site_store`: the store a site's engines use on an alias (``PgEventStore`` on
  PostgreSQL with psycopg 3, ``SqliteEventStore`` on SQLite: awaits with no thread hop
  per call; else the Django store, whose async methods hop to Django's executor);
- :mod:`.redis`: :class:`~aaa_django.store.redis.RedisEventStore`, the log in Redis.

(What every engine reads through, whichever store: ``aaa_django.events.tail``.)
"""

from .database import DjangoEventStore, EventList
from .postgres import site_store

__all__ = ["DjangoEventStore", "EventList", "site_store"]
