"""Where the log is kept: the adapters of the core's ``EventStore``.

- :mod:`.database`: :class:`DjangoEventStore`, the log in the site's database (any
  backend Django has; the invariants enforced by the schema, ``migrations/0002``);
  its plain-SQL rows (:mod:`.rows`) and one-statement appends (:mod:`.appends`);
- :mod:`.runindex`: the run index (``aaa_run``), derived from the log in the same
  transaction as each append;
- :mod:`.postgres`: :class:`~aaa_django.store.postgres.PgEventStore`, the same log
  through psycopg's async connections (:mod:`.connections`, the runtime's own), with
  :mod:`.groupcommit` sharing one transaction between runs appending at once;
- :mod:`.redis`: :class:`~aaa_django.store.redis.RedisEventStore`, the log in Redis.

(What every engine reads through, whichever store: ``aaa_django.events.tail``.)
"""

from .database import DjangoEventStore, EventList

__all__ = ["DjangoEventStore", "EventList"]
