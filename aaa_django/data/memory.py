"""``InMemoryBlobStore``: a dict, for tests and single-process, non-durable use."""

from __future__ import annotations

import builtins
import threading
import time

from .errors import BlobNotFoundError
from .keys import check_segment, namespace_segment
from .refs import DEFAULT_MEDIA_TYPE, BlobRef, as_bytes, as_ref, check_namespace, check_sha256


class InMemoryBlobStore:
    """A :class:`~aaa_django.data.BlobStore` in a dict; thread-safe, lost at exit.

    Reads are verified like every other store's, so a test can corrupt an entry and
    see ``BlobIntegrityError``.
    """

    def __init__(self) -> None:
        # (namespace, sha256) -> (bytes, media type recorded by the first put)
        self._blobs: dict[tuple[str, str], tuple[bytes, str]] = {}
        # (namespace, sha256) -> when the first put stored it (epoch seconds)
        self._written: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def put(self, data: bytes, media_type: str = DEFAULT_MEDIA_TYPE, *, namespace: str = "") -> BlobRef:
        """Store ``data`` (once per namespace) and return its ref."""
        data = as_bytes(data)
        ref = BlobRef.for_bytes(data, media_type, namespace=namespace)
        key = (ref.namespace, ref.sha256)
        with self._lock:
            if key not in self._blobs:
                self._blobs[key] = (data, ref.media_type)
                self._written[key] = time.time()
        return ref

    def get(self, ref: BlobRef) -> bytes:
        """The verified bytes of ``ref``."""
        ref = as_ref(ref)
        try:
            data, _ = self._blobs[(ref.namespace, ref.sha256)]
        except KeyError:
            raise BlobNotFoundError(f"no blob {ref.key!r}") from None
        return ref.verify(data)

    def exists(self, ref: BlobRef) -> bool:
        """Whether a blob is stored under ``ref``'s namespace and hash."""
        ref = as_ref(ref)
        return (ref.namespace, ref.sha256) in self._blobs

    def delete(self, ref: BlobRef) -> None:
        """Remove the blob; no error if it is already gone."""
        ref = as_ref(ref)
        with self._lock:
            self._blobs.pop((ref.namespace, ref.sha256), None)
            self._written.pop((ref.namespace, ref.sha256), None)

    def delete_namespace(self, namespace: str) -> int:
        """Remove every blob of ``namespace``; return how many were removed."""
        check_namespace(namespace)
        with self._lock:
            keys = [k for k in self._blobs if k[0] == namespace]
            for k in keys:
                del self._blobs[k]
                self._written.pop(k, None)
        return len(keys)

    def list(self, namespace: str) -> builtins.list[BlobRef]:
        """The refs of every blob in ``namespace``, sorted by hash."""
        check_namespace(namespace)
        with self._lock:
            items = [(k[1], v) for k, v in self._blobs.items() if k[0] == namespace]
        return [
            BlobRef(sha, len(data), media_type, namespace)
            for sha, (data, media_type) in sorted(items, key=lambda item: item[0])
        ]

    # -- BlobInventory (the orphan sweep) ---------------------------------------------

    def segments(self) -> builtins.list[str]:
        """The segments of every namespace that holds blobs."""
        with self._lock:
            return sorted({namespace_segment(ns) for ns, _ in self._blobs})

    def hashes(self, segment: str) -> builtins.list[str]:
        """The hashes of the blobs under ``segment``."""
        return [sha for _, sha in self._keys(segment)]

    def written_at(self, segment: str, sha256: str) -> float | None:
        """When the blob was first stored."""
        for key in self._keys(segment):
            if key[1] == sha256:
                return self._written.get(key)
        return None

    def discard(self, segment: str, sha256: str) -> None:
        """Remove one blob by segment and hash."""
        check_segment(segment)
        check_sha256(sha256)
        with self._lock:
            for key in [k for k in self._blobs if k[1] == sha256 and namespace_segment(k[0]) == segment]:
                del self._blobs[key]
                self._written.pop(key, None)

    def _keys(self, segment: str) -> builtins.list[tuple[str, str]]:
        check_segment(segment)
        with self._lock:
            return sorted(k for k in self._blobs if namespace_segment(k[0]) == segment)
