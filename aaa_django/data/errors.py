"""Blob store errors: one exception type per failure a caller can act on; and
:class:`InfrastructureError`, the core's one classification of a failed service (here,
in the core's lowest layer, for the blob stores and the event stores alike:
``aaa_django.events`` re-exports it)."""

from __future__ import annotations

from collections.abc import Callable


class InfrastructureError(Exception):
    """A service the engine stands on failed: the event store's database, the blob
    store, the broker. Not the run's fault, nor the caller's.

    Adapters raise it at their boundary in place of their driver's errors (the driver's
    exception is its ``__cause__``), so the core decides on one classification:

    - ``transient``: an outage that retrying is expected to outlast (a lost
      connection, a restart, a timeout, throttling). A delivery is retried with
      backoff; the API answers 503 with ``Retry-After``.
    - persistent (``transient=False``): retrying repeats it (a missing bucket or
      table, refused credentials). The run it hits ends ``failed`` with this error's
      message as the reason.

    ``service`` names what failed (``"event store"``, ``"blob store"``, ``"broker"``).
    """

    service = "infrastructure"

    def __init__(self, message: str, *, transient: bool = True, service: str | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        if service is not None:
            self.service = service

    # picklable with its flags (Celery keeps a task's error)
    def __reduce__(self) -> tuple[Callable[..., InfrastructureError], tuple[type, str, bool, str]]:
        return (_rebuild, (type(self), str(self), self.transient, self.service))


def _rebuild(cls: type, message: str, transient: bool, service: str) -> InfrastructureError:
    return cls(message, transient=transient, service=service)


class BlobError(Exception):
    """Base class of every blob store error."""


class BlobNotFoundError(BlobError, LookupError):
    """No blob is stored under the ref's namespace and hash (never written, or deleted)."""


class BlobIntegrityError(BlobError):
    """The stored bytes do not hash to the ref's SHA-256 (or have another size).

    Raised on read: the blob was tampered with or corrupted at rest. The bytes are
    never returned to the caller.
    """


class BlobStoreUnavailable(InfrastructureError, BlobError):
    """The storage behind a blob store failed (an S3 error, a full disk): an
    :class:`InfrastructureError`, ``transient`` or not."""

    service = "blob store"
