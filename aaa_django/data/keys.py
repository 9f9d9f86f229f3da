"""How blobs are laid out in hierarchical storage (a directory tree or bucket keys).

Shared by :class:`~aaa_django.data.files.FileBlobStore` and the Django storage
adapter so both name things the same way:

    <namespace segment>/<sha[:2]>/.../<sha256>             the blob's bytes
    <namespace segment>/<sha[:2]>/.../<sha256>.meta.json   {"media_type", "size"}

A namespace is an arbitrary string (a stream name, maybe with ``/``, ``..`` or NUL),
so it is never used as a path as-is: :func:`namespace_segment` turns it into one
safe, injective path segment.
"""

from __future__ import annotations

import hashlib
import json
import re

from .refs import DEFAULT_MEDIA_TYPE, check_media_type, check_namespace

META_SUFFIX = ".meta.json"

# Kept as themselves: enough for readable stream names ("run-0192ab…"). Every other
# byte, "." and "~" included, becomes "~XX" (uppercase hex), so a segment is never
# "." or "..", never holds a separator, and "~~" is free to mark the cases below.
# "~" rather than "%": it is unreserved in URLs, so S3-compatible servers and SDKs
# never decode it (moto decodes "%2E" in listed prefixes, for one).
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPE = "~"
# Path segments are limited to 255 bytes on common filesystems; longer encodings
# are replaced by a hash (one-way: the orphan sweep compares segments, not names).
_MAX_SEGMENT = 150
_EMPTY_SEGMENT = "~~"
_BLOB_NAME_RE = re.compile(r"[0-9a-f]{64}")
#: the segment of a namespace too long to spell out: "~~" and the SHA-256 of its name
HASHED_SEGMENT = re.compile(r"~~[0-9a-f]{64}")


def namespace_segment(namespace: str) -> str:
    """One path segment that names ``namespace``, distinct for distinct namespaces.

    ``"run-1"`` -> ``"run-1"``; ``"../x"`` -> ``"~2E~2E~2Fx"``; ``""`` -> ``"~~"``;
    an encoding longer than 150 chars -> ``"~~"`` + its SHA-256. The output uses only
    ``[A-Za-z0-9_~-]``, safe in file names and object keys alike. Letters keep their
    case, so namespaces that differ only in case would share a directory on a
    case-insensitive filesystem.
    """
    check_namespace(namespace)
    if namespace == "":
        return _EMPTY_SEGMENT
    # surrogatepass: any str is a valid namespace, even one that is not valid UTF-8.
    raw = namespace.encode("utf-8", "surrogatepass")
    encoded = "".join(chr(b) if b in _SAFE else f"{_ESCAPE}{b:02X}" for b in raw)
    if len(encoded) > _MAX_SEGMENT:
        return _EMPTY_SEGMENT + hashlib.sha256(raw).hexdigest()
    return encoded


def segment_namespace(segment: str) -> str | None:
    """The namespace :func:`namespace_segment` turned into ``segment``, or None when
    the segment does not say (a long namespace's hash, or a name no store wrote)."""
    if segment == _EMPTY_SEGMENT:
        return ""
    if segment.startswith(_EMPTY_SEGMENT) or len(segment) > _MAX_SEGMENT or not segment:
        return None
    out = bytearray()
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == _ESCAPE:
            code = segment[i + 1 : i + 3]
            if len(code) != 2 or not re.fullmatch(r"[0-9A-F]{2}", code) or int(code, 16) in _SAFE:
                return None
            out.append(int(code, 16))
            i += 3
        elif ord(c) < 128 and ord(c) in _SAFE:
            out.append(ord(c))
            i += 1
        else:
            return None
    try:
        return out.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None


def shards(sha256: str, depth: int) -> list[str]:
    """The ``depth`` two-hex-digit directories a blob sits in (``ab``, ``cd``, …)."""
    return [sha256[2 * i : 2 * i + 2] for i in range(depth)]


def is_blob_name(name: str) -> bool:
    """True for a blob's own file name (its hash), false for sidecars and temp files."""
    return bool(_BLOB_NAME_RE.fullmatch(name))


def encode_meta(media_type: str, size: int) -> bytes:
    """The sidecar's content."""
    return json.dumps({"media_type": media_type, "size": size}, sort_keys=True).encode()


def decode_meta(raw: bytes) -> tuple[str, int | None]:
    """``(media_type, size)`` from a sidecar; defaults when it is unreadable.

    The sidecar only feeds ``list()``; reads are verified against the ref, so a
    damaged sidecar degrades a listing, never the data.
    """
    try:
        meta = json.loads(raw)
        media_type = check_media_type(meta["media_type"])
        size = meta.get("size")
        return media_type, size if type(size) is int and size >= 0 else None
    except (ValueError, TypeError, KeyError):
        return DEFAULT_MEDIA_TYPE, None


def is_segment(name: str) -> bool:
    """Whether ``name`` is a segment :func:`namespace_segment` can make."""
    return segment_namespace(name) is not None or bool(HASHED_SEGMENT.fullmatch(name))


def check_segment(segment: object) -> str:
    """Return ``segment`` if :func:`is_segment`, else raise (it becomes a path or key)."""
    if not isinstance(segment, str):
        raise TypeError(f"a segment is a str, not {type(segment).__name__}")
    if not is_segment(segment):
        raise ValueError(f"not a namespace segment: {segment[:80]!r}")
    return segment
