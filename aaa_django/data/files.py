"""``FileBlobStore``: blobs as files under one root directory."""

from __future__ import annotations

import builtins
import contextlib
import os
import tempfile
from pathlib import Path

from .errors import BlobNotFoundError
from .keys import (
    META_SUFFIX,
    check_segment,
    decode_meta,
    encode_meta,
    is_blob_name,
    is_segment,
    namespace_segment,
    shards,
)
from .refs import DEFAULT_MEDIA_TYPE, BlobRef, as_bytes, as_ref, check_namespace, check_sha256

_SHARD_DEPTH = 2  # root/<namespace>/ab/cd/<sha256>: at most 256 entries per level


class FileBlobStore:
    """A :class:`~aaa_django.data.BlobStore` on a local (or shared) filesystem.

    Layout: ``root/<namespace segment>/<ab>/<cd>/<sha256>`` with a
    ``<sha256>.meta.json`` sidecar holding the media type (see
    :mod:`aaa_django.data.keys`). Writes are atomic (temp file in the same directory,
    fsync, ``os.replace``, fsync of the directory), so a reader never sees a partial
    blob. Every read is verified. Namespaces are encoded and hashes validated, so no
    argument can name a path outside ``root``. Files are created with mode 0600 (the
    ``tempfile`` default): run every process that shares the volume as one user.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))

    def __repr__(self) -> str:
        return f"FileBlobStore({str(self.root)!r})"

    def put(self, data: bytes, media_type: str = DEFAULT_MEDIA_TYPE, *, namespace: str = "") -> BlobRef:
        """Store ``data`` (once per namespace) and return its ref."""
        data = as_bytes(data)
        ref = BlobRef.for_bytes(data, media_type, namespace=namespace)
        path = self._path(ref)
        meta = path.with_name(path.name + META_SUFFIX)
        # Bytes first, sidecar second: a crash in between leaves a readable blob whose
        # sidecar the next put of the same bytes writes.
        if not path.is_file():
            _make_dirs(self.root, path.parent)
            _write_atomic(path, data)
        if not meta.is_file():
            _write_atomic(meta, encode_meta(ref.media_type, ref.size))
        return ref

    def get(self, ref: BlobRef) -> bytes:
        """The verified bytes of ``ref``."""
        ref = as_ref(ref)
        try:
            with open(self._path(ref), "rb") as f:
                # One byte more than expected is enough to prove a wrong size, without
                # reading a huge substituted file into memory.
                data = f.read(ref.size + 1)
        except FileNotFoundError:
            raise BlobNotFoundError(f"no blob {ref.key!r} in {self.root}") from None
        return ref.verify(data)

    def exists(self, ref: BlobRef) -> bool:
        """Whether a blob is stored under ``ref``'s namespace and hash."""
        return self._path(as_ref(ref)).is_file()

    def delete(self, ref: BlobRef) -> None:
        """Remove the blob; no error if it is already gone."""
        path = self._path(as_ref(ref))
        # Sidecar first: a blob without a sidecar is still listed; the reverse is not.
        path.with_name(path.name + META_SUFFIX).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        # Empty shard directories stay (removing them would race a concurrent put
        # into the same shard); delete_namespace removes them with the namespace.

    def delete_namespace(self, namespace: str) -> int:
        """Remove every blob of ``namespace`` (and its directory); return the count."""
        top = self.root / namespace_segment(namespace)
        removed = 0
        # Bottom-up, never following symlinks: only what lies under `top` is removed.
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            for name in filenames:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))
                    removed += is_blob_name(name)
            for name in dirnames:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(dirpath, name))
        with contextlib.suppress(OSError):
            top.rmdir()
        return removed

    def list(self, namespace: str) -> builtins.list[BlobRef]:
        """The refs of every blob in ``namespace``, sorted by hash."""
        check_namespace(namespace)
        refs = []
        for dirpath, _, filenames in os.walk(self.root / namespace_segment(namespace)):
            for name in filenames:
                if is_blob_name(name):
                    ref = self._listed(Path(dirpath) / name, namespace)
                    if ref is not None:
                        refs.append(ref)
        return sorted(refs, key=lambda r: r.sha256)

    # -- BlobInventory (the orphan sweep) ---------------------------------------------

    def segments(self) -> builtins.list[str]:
        """The segments (top directories) of every namespace that holds blobs."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) and is_segment(e.name))

    def hashes(self, segment: str) -> builtins.list[str]:
        """The hashes of the blobs under ``segment``."""
        found: builtins.list[str] = []
        for _, _, filenames in os.walk(self._segment_dir(segment)):
            found.extend(name for name in filenames if is_blob_name(name))
        return sorted(found)

    def written_at(self, segment: str, sha256: str) -> float | None:
        """The blob file's modification time."""
        try:
            return self._blob_path(self._segment_dir(segment), check_sha256(sha256)).stat().st_mtime
        except FileNotFoundError:
            return None

    def discard(self, segment: str, sha256: str) -> None:
        """Remove one blob (and its sidecar) by segment and hash."""
        path = self._blob_path(self._segment_dir(segment), check_sha256(sha256))
        path.with_name(path.name + META_SUFFIX).unlink(missing_ok=True)
        path.unlink(missing_ok=True)

    def _segment_dir(self, segment: str) -> Path:
        return self.root / check_segment(segment)

    def _path(self, ref: BlobRef) -> Path:
        return self._blob_path(self.root / namespace_segment(ref.namespace), ref.sha256)

    @staticmethod
    def _blob_path(top: Path, sha256: str) -> Path:
        return top.joinpath(*shards(sha256, _SHARD_DEPTH), sha256)

    def _listed(self, path: Path, namespace: str) -> BlobRef | None:
        """The ref of a listed blob file, or None if it vanished meanwhile."""
        try:
            media_type, size = decode_meta(path.with_name(path.name + META_SUFFIX).read_bytes())
        except FileNotFoundError:
            media_type, size = DEFAULT_MEDIA_TYPE, None
        try:
            size = path.stat().st_size if size is None else size
        except FileNotFoundError:
            return None
        return BlobRef(path.name, size, media_type, namespace)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)  # the rename itself must survive a power cut


def _make_dirs(root: Path, directory: Path) -> None:
    """``mkdir -p directory`` below ``root``, fsyncing each parent that gained an entry."""
    if directory.is_dir():
        return
    root.mkdir(parents=True, exist_ok=True)
    d = root
    for part in directory.relative_to(root).parts:
        d = d / part
        try:
            d.mkdir()
        except FileExistsError:  # made by an earlier or a concurrent put
            continue
        _fsync_dir(d.parent)


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
