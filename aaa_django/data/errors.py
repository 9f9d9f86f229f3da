"""Blob store errors: one exception type per failure a caller can act on."""

from aaa_django.events.errors import InfrastructureError


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
    :class:`~aaa_django.events.errors.InfrastructureError`, ``transient`` or not."""

    service = "blob store"
