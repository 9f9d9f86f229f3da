"""The ``BlobStore`` protocol every blob store implements, and the optional
``NamespacedBlobStore`` capability."""

from __future__ import annotations

import builtins
from typing import Protocol, runtime_checkable

from .refs import DEFAULT_MEDIA_TYPE, BlobRef


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed, hash-verified storage of byte strings (spec 004's four
    methods: all the engine needs).

    - ``put`` stores ``data`` and returns its ref; the same bytes are stored once.
    - ``get`` returns the bytes after checking their SHA-256 and size against the ref
      on every read: ``BlobIntegrityError`` on a mismatch, ``BlobNotFoundError`` when
      nothing is stored under the ref.
    - ``delete`` is idempotent.
    - A malformed ref raises ``TypeError`` / ``ValueError`` before any I/O. Methods are
      synchronous; async callers run them in a thread.

    A store that also keeps namespaces is a :class:`NamespacedBlobStore` (every store
    shipped here is). ``aaa_django/testing/blobstore.py`` is the executable form of both.
    """

    def put(self, data: bytes, media_type: str = DEFAULT_MEDIA_TYPE) -> BlobRef:
        """Store ``data`` (once) and return its ref."""
        ...

    def get(self, ref: BlobRef) -> bytes:
        """The verified bytes of ``ref``."""
        ...

    def exists(self, ref: BlobRef) -> bool:
        """Whether a blob is stored under ``ref`` (not verified)."""
        ...

    def delete(self, ref: BlobRef) -> None:
        """Remove the blob; no error if it is already gone."""
        ...


@runtime_checkable
class NamespacedBlobStore(BlobStore, Protocol):
    """A blob store with namespaces (a stream each): the optional capability the
    engine detects once, when it is given the store.

    - ``put(..., namespace=)`` stores ``data`` under ``namespace``: the same bytes in
      two namespaces are two blobs, so deleting one namespace never touches another;
      the ref carries the namespace, and ``get`` / ``exists`` / ``delete`` look there.
    - ``delete_namespace`` erases every blob of a namespace and returns how many
      there were (the engine erases a run's blobs with one call).
    - ``list`` gives the refs of a namespace.

    A plain :class:`BlobStore` works too: the engine then makes each claim-checked
    payload its stream's own in the payload itself (see
    :func:`aaa_django.data.claims.put_claim`), and erases a run's blobs ref by ref.
    """

    def put(self, data: bytes, media_type: str = DEFAULT_MEDIA_TYPE, *, namespace: str = "") -> BlobRef:
        """Store ``data`` (once per namespace) and return its ref."""
        ...

    def delete_namespace(self, namespace: str) -> int:
        """Remove every blob of ``namespace``; return how many were removed."""
        ...

    def list(self, namespace: str) -> builtins.list[BlobRef]:
        """The refs of every blob in ``namespace``, sorted by hash."""
        ...


class BlobReader(Protocol):
    """What reading a claim-checked payload back needs of a store (:func:`hydrate`):
    every :class:`BlobStore` is one; so is an export's blobs, read-only."""

    def get(self, ref: BlobRef) -> bytes:
        """The blob's bytes, verified against ``ref``."""
        ...


@runtime_checkable
class BlobInventory(Protocol):
    """What a blob store offers beyond :class:`BlobStore` to the orphan sweep
    (``aaa_django.site.retention``): every blob it holds, its age, and deleting one.

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
