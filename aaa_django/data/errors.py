"""Blob store errors: one exception type per failure a caller can act on."""


class BlobError(Exception):
    """Base class of every blob store error."""


class BlobNotFoundError(BlobError, LookupError):
    """No blob is stored under the ref's namespace and hash (never written, or deleted)."""


class BlobIntegrityError(BlobError):
    """The stored bytes do not hash to the ref's SHA-256 (or have another size).

    Raised on read: the blob was tampered with or corrupted at rest. The bytes are
    never returned to the caller.
    """
