"""The ``BlobStore`` protocol every blob store implements."""

from __future__ import annotations

import builtins
from typing import Protocol, runtime_checkable

from .refs import DEFAULT_MEDIA_TYPE, BlobRef


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed, namespaced, hash-verified storage of byte strings.

    - ``put`` stores ``data`` under ``namespace`` and returns its ref. Putting the
      same bytes twice in one namespace stores them once; the same bytes in two
      namespaces are two blobs, so deleting one namespace never touches another.
    - ``get`` returns the bytes after checking their SHA-256 and size against the ref
      on every read: ``BlobIntegrityError`` on a mismatch, ``BlobNotFoundError`` when
      nothing is stored under the ref's namespace and hash.
    - ``delete`` is idempotent; ``delete_namespace`` erases every blob of a namespace
      (a stream) and returns how many there were.
    - A malformed ref or namespace raises ``TypeError`` / ``ValueError`` before any
      I/O. Methods are synchronous; async callers run them in a thread.

    ``tests/contracts/blobstore.py`` is the executable form of this contract.
    """

    def put(
        self, data: bytes, media_type: str = DEFAULT_MEDIA_TYPE, *, namespace: str = ""
    ) -> BlobRef:
        """Store ``data`` (once per namespace) and return its ref."""
        ...

    def get(self, ref: BlobRef) -> bytes:
        """The verified bytes of ``ref``."""
        ...

    def exists(self, ref: BlobRef) -> bool:
        """Whether a blob is stored under ``ref``'s namespace and hash (not verified)."""
        ...

    def delete(self, ref: BlobRef) -> None:
        """Remove the blob; no error if it is already gone."""
        ...

    def delete_namespace(self, namespace: str) -> int:
        """Remove every blob of ``namespace``; return how many were removed."""
        ...

    def list(self, namespace: str) -> builtins.list[BlobRef]:
        """The refs of every blob in ``namespace``, sorted by hash."""
        ...


@runtime_checkable
class BlobInventory(Protocol):
    """What a blob store offers beyond :class:`BlobStore` to the orphan sweep
    (``aaa_django.retention``): every blob it holds, its age, and deleting one.

    Namespaces are named by their segment (``aaa_django.data.keys.namespace_segment``):
    a long namespace is stored under its hash, which cannot be turned back into the
    name, so the sweep compares the segments of the streams it knows with these.
    """

    def segments(self) -> builtins.list[str]:
        """The segments of every namespace that holds blobs (in no set order)."""
        ...

    def hashes(self, segment: str) -> builtins.list[str]:
        """The SHA-256 of every blob stored under ``segment``."""
        ...

    def written_at(self, segment: str, sha256: str) -> float | None:
        """When the blob was stored (epoch seconds); None when the store cannot say
        or the blob is gone."""
        ...

    def discard(self, segment: str, sha256: str) -> None:
        """Remove one blob named by segment and hash; no error if it is gone."""
        ...
