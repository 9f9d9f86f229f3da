"""``StorageBlobStore``: the blob store over any Django ``Storage``.

Point it at a ``STORAGES`` alias (``AAA["BLOB_STORAGE"]``) to keep claim-checked
payloads wherever the site keeps files: the local ``FileSystemStorage``, or an S3
bucket through django-storages' ``S3Storage``, so that every worker can read them.
"""

from __future__ import annotations

import builtins
import functools
import gzip
import posixpath
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages

from aaa_django.data.errors import BlobError, BlobNotFoundError, BlobStoreUnavailable
from aaa_django.data.keys import (
    META_SUFFIX,
    check_segment,
    decode_meta,
    encode_meta,
    is_blob_name,
    is_segment,
    namespace_segment,
    shards,
)
from aaa_django.data.refs import (
    DEFAULT_MEDIA_TYPE,
    BlobRef,
    as_bytes,
    as_ref,
    check_namespace,
    check_sha256,
)
from aaa_django.store.faults import translate

_SHARD_DEPTH = 1  # prefix/<namespace>/ab/<sha256>: few listdir calls per namespace

P = ParamSpec("P")
T = TypeVar("T")


def _translated(method: Callable[P, T]) -> Callable[P, T]:
    """The storage's errors (an S3 ``ClientError``, a file system's ``OSError``) leave
    as :class:`~aaa_django.data.BlobStoreUnavailable`, transient or not (see
    :mod:`aaa_django.store.faults`), the driver's error as its cause. The store's own errors
    (a missing or corrupt blob, a malformed ref) pass as they are."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except BlobError:
            raise
        except Exception as exc:
            fault = translate(exc, BlobStoreUnavailable)
            if fault is None:
                raise
            raise fault from exc

    return call


class StorageBlobStore:
    """A :class:`~aaa_django.data.BlobStore` over a Django storage backend.

    Give either a ``storage`` instance or the ``alias`` of one in ``STORAGES``
    (looked up on each use, so ``override_settings(STORAGES=...)`` is honoured);
    with neither, the ``"default"`` storage is used. Keys are
    ``<prefix>/<namespace segment>/<ab>/<sha256>``, with a ``<sha256>.meta.json``
    sidecar holding the media type for ``list()`` (a read is one object: the ref
    already carries the media type). Every read is verified against the ref.

    The ``Storage`` API is all it needs (``save``, ``open``, ``exists``, ``delete``,
    ``listdir``, ``size``), so any backend that implements ``listdir`` works;
    S3Storage and FileSystemStorage are tested. On django-storages' ``S3Storage`` a
    read is one GET (its ``open()`` would add two HEADs).
    """

    def __init__(
        self,
        storage: Storage | None = None,
        *,
        alias: str | None = None,
        prefix: str = "aaa-blobs",
    ) -> None:
        if storage is not None and alias is not None:
            raise ValueError("give a storage or an alias, not both")
        self._storage = storage
        self.alias = alias if storage is None and alias is not None else "default"
        self.prefix = _check_prefix(prefix)

    def __repr__(self) -> str:
        where = repr(self._storage) if self._storage is not None else f"alias={self.alias!r}"
        return f"StorageBlobStore({where}, prefix={self.prefix!r})"

    @property
    def storage(self) -> Storage:
        """The Django storage the blobs live in."""
        return self._storage if self._storage is not None else storages[self.alias]

    @_translated
    def put(self, data: bytes, media_type: str = DEFAULT_MEDIA_TYPE, *, namespace: str = "") -> BlobRef:
        """Store ``data`` (once per namespace) and return its ref."""
        data = as_bytes(data)
        ref = BlobRef.for_bytes(data, media_type, namespace=namespace)
        key = self._key(ref.namespace, ref.sha256)
        storage = self.storage
        # Bytes first, sidecar second (see FileBlobStore.put).
        if not storage.exists(key):
            self._save(storage, key, data, ref.media_type)
            self._save(storage, key + META_SUFFIX, encode_meta(ref.media_type, ref.size))
        elif not storage.exists(key + META_SUFFIX):
            self._save(storage, key + META_SUFFIX, encode_meta(ref.media_type, ref.size))
        return ref

    @_translated
    def get(self, ref: BlobRef) -> bytes:
        """The verified bytes of ``ref``."""
        ref = as_ref(ref)
        key = self._key(ref.namespace, ref.sha256)
        try:
            # One byte more than expected proves a wrong size without reading all of
            # a substituted object into memory.
            data = _read(self.storage, key, ref.size + 1)
        except FileNotFoundError:
            raise BlobNotFoundError(f"no blob {ref.key!r} at {key!r}") from None
        return ref.verify(data)

    @_translated
    def exists(self, ref: BlobRef) -> bool:
        """Whether a blob is stored under ``ref``'s namespace and hash."""
        ref = as_ref(ref)
        return self.storage.exists(self._key(ref.namespace, ref.sha256))

    @_translated
    def delete(self, ref: BlobRef) -> None:
        """Remove the blob; no error if it is already gone."""
        ref = as_ref(ref)
        key = self._key(ref.namespace, ref.sha256)
        storage = self.storage
        # Sidecar first: a blob without a sidecar is still listed; the reverse is not.
        storage.delete(key + META_SUFFIX)
        storage.delete(key)

    @_translated
    def delete_namespace(self, namespace: str) -> int:
        """Remove every blob of ``namespace``; return how many were removed."""
        storage = self.storage
        top = self._top(namespace)
        removed = 0
        shard_dirs = []
        for shard_dir, names in self._walk(storage, top):
            shard_dirs.append(shard_dir)
            for name in sorted(names, key=is_blob_name):  # sidecars before blobs
                storage.delete(posixpath.join(shard_dir, name))
                removed += is_blob_name(name)
        if _has_directories(storage):
            # FileSystemStorage.delete() removes an empty directory; on object
            # stores "directories" are only key prefixes and vanish by themselves.
            for d in [*shard_dirs, top]:
                try:
                    storage.delete(d)
                except OSError:  # not empty: a concurrent put; leave it
                    pass
        return removed

    @_translated
    def list(self, namespace: str) -> builtins.list[BlobRef]:
        """The refs of every blob in ``namespace``, sorted by hash."""
        check_namespace(namespace)
        storage = self.storage
        refs = []
        for shard_dir, names in self._walk(storage, self._top(namespace)):
            for name in names:
                if is_blob_name(name):
                    ref = self._listed(storage, posixpath.join(shard_dir, name), namespace)
                    if ref is not None:
                        refs.append(ref)
        return sorted(refs, key=lambda r: r.sha256)

    # -- BlobInventory (the orphan sweep) ---------------------------------------------

    @_translated
    def segments(self) -> builtins.list[str]:
        """The segments of every namespace under the prefix (one listing)."""
        try:
            dirs, _ = self.storage.listdir(self.prefix)
        except FileNotFoundError:  # FileSystemStorage: nothing stored yet
            return []
        return sorted(d for d in dirs if is_segment(d))

    @_translated
    def hashes(self, segment: str) -> builtins.list[str]:
        """The hashes of the blobs under ``segment``."""
        top = posixpath.join(self.prefix, check_segment(segment))
        return sorted(n for _, names in self._walk(self.storage, top) for n in names if is_blob_name(n))

    @_translated
    def written_at(self, segment: str, sha256: str) -> float | None:
        """The object's modification time (on S3 a HEAD: the sweep asks only about
        blobs no event refers to)."""
        key = self._segment_key(segment, sha256)
        try:
            return self.storage.get_modified_time(key).timestamp()
        except (FileNotFoundError, NotImplementedError):
            return None
        except Exception as exc:
            if _s3_missing(exc):
                return None
            raise

    @_translated
    def discard(self, segment: str, sha256: str) -> None:
        """Remove one blob (sidecar first) by segment and hash."""
        key = self._segment_key(segment, sha256)
        storage = self.storage
        storage.delete(key + META_SUFFIX)
        storage.delete(key)

    def _top(self, namespace: str) -> str:
        return posixpath.join(self.prefix, namespace_segment(namespace))

    def _key(self, namespace: str, sha256: str) -> str:
        return posixpath.join(self._top(namespace), *shards(sha256, _SHARD_DEPTH), sha256)

    def _segment_key(self, segment: str, sha256: str) -> str:
        check_sha256(sha256)
        return posixpath.join(self.prefix, check_segment(segment), *shards(sha256, _SHARD_DEPTH), sha256)

    @staticmethod
    def _walk(storage: Storage, top: str) -> builtins.list[tuple[str, builtins.list[str]]]:
        """``(shard directory, file names)`` for each shard under ``top``."""
        try:
            dirs, _ = storage.listdir(top)
        except FileNotFoundError:  # FileSystemStorage: namespace never written
            return []
        found = []
        for d in dirs:
            shard_dir = posixpath.join(top, d)
            try:
                found.append((shard_dir, storage.listdir(shard_dir)[1]))
            except FileNotFoundError:  # removed concurrently
                continue
        return found

    @staticmethod
    def _save(storage: Storage, key: str, data: bytes, content_type: str = "application/json") -> None:
        content = ContentFile(data)
        # S3Storage sends this as the object's Content-Type; other backends ignore it.
        content.content_type = content_type
        saved = storage.save(key, content)
        if saved != key:
            # The backend does not overwrite (FileSystemStorage) and a concurrent put
            # stored this key first; the content is the same by construction, so
            # drop the renamed duplicate.
            storage.delete(saved)

    @staticmethod
    def _listed(storage: Storage, key: str, namespace: str) -> BlobRef | None:
        """The ref of a listed blob, or None if it vanished meanwhile."""
        try:
            media_type, size = decode_meta(_read(storage, key + META_SUFFIX))
        except FileNotFoundError:
            media_type, size = DEFAULT_MEDIA_TYPE, None
        if size is None:
            try:
                size = storage.size(key)
            except FileNotFoundError:
                return None
        return BlobRef(posixpath.basename(key), size, media_type, namespace)


def _read(storage: Storage, key: str, limit: int = -1) -> bytes:
    """Up to ``limit`` bytes of ``key`` (all with -1); ``FileNotFoundError`` if absent."""
    s3 = sys.modules.get("storages.backends.s3")  # imported if `storage` is an S3Storage
    if s3 is not None and isinstance(storage, s3.S3Storage):
        return _read_s3(storage, key, limit)
    with storage.open(key, "rb") as f:
        return f.read(limit)


def _read_s3(storage: Storage, key: str, limit: int) -> bytes:
    """One GET. ``S3Storage.open()`` sends two HEADs before its GET, on every read."""
    from botocore.exceptions import ClientError
    from s3transfer.constants import ALLOWED_DOWNLOAD_ARGS
    from storages.utils import safe_join

    name = safe_join(storage.location, key)  # what S3Storage.open() would address
    # The site's per-object parameters that apply to a download (SSE-C keys, ...).
    params = {k: v for k, v in storage.get_object_parameters(name).items() if k in ALLOWED_DOWNLOAD_ARGS}
    try:
        response = storage.bucket.Object(name).get(**params)
    except ClientError as e:
        if _s3_missing(e):
            raise FileNotFoundError(name) from None
        raise
    body = response["Body"]
    try:
        if storage.gzip and response.get("ContentEncoding") == "gzip":
            # As S3Storage.open() does for objects it gzipped on save.
            data = gzip.decompress(body.read())
            return data if limit < 0 else data[:limit]
        if limit < 0:
            return body.read()
        # A stream may return fewer bytes than asked before its end: read until
        # `limit` bytes or EOF.
        chunks, remaining = [], limit
        while remaining > 0 and (chunk := body.read(remaining)):
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        body.close()


def _s3_missing(exc: BaseException) -> bool:
    """Whether ``exc`` is botocore's answer for an object that does not exist."""
    botocore = sys.modules.get("botocore.exceptions")
    return (
        botocore is not None
        and isinstance(exc, botocore.ClientError)
        and exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404
    )


def _check_prefix(prefix: str) -> str:
    """``prefix`` without outer slashes; no ``.``/``..``/empty segments inside."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    prefix = prefix.strip("/")
    if prefix and any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in prefix.split("/")):
        raise ValueError(f"prefix must be a plain relative path, got {prefix!r}")
    return prefix


def _has_directories(storage: Storage) -> bool:
    """True for storages with real directories (those that implement ``path()``)."""
    try:
        storage.path("")
    except NotImplementedError:
        return False
    return True
