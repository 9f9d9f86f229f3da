"""``BlobRef``: the value that points at one stored blob."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from .errors import BlobIntegrityError

DEFAULT_MEDIA_TYPE = "application/octet-stream"

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# A media type is one header value: printable ASCII, no control characters. Params
# ("text/plain; charset=utf-8") are allowed; CR/LF (header injection) are not.
_MEDIA_TYPE_RE = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,254}")


def check_sha256(value: object) -> str:
    """Return ``value`` if it is a lowercase 64-digit hex SHA-256, else raise.

    Stores build paths and keys from the hash, so this is the guard that keeps a
    forged ref (``"../../etc/passwd"``) from naming anything outside the store.
    """
    if not isinstance(value, str):
        raise TypeError(f"sha256 must be a str, not {type(value).__name__}")
    if not _SHA256_RE.fullmatch(value):
        raise ValueError(f"sha256 must be 64 lowercase hex digits, got {value[:80]!r}")
    return value


def check_namespace(value: object) -> str:
    """Return ``value`` if it is a str (any str: stores encode it safely), else raise."""
    if not isinstance(value, str):
        raise TypeError(f"namespace must be a str, not {type(value).__name__}")
    return value


def check_media_type(value: object) -> str:
    """Return ``value`` if it is a plausible media type (one printable ASCII line)."""
    if not isinstance(value, str):
        raise TypeError(f"media_type must be a str, not {type(value).__name__}")
    if not _MEDIA_TYPE_RE.fullmatch(value):
        raise ValueError(f"media_type must be printable ASCII of 1-255 chars, got {value[:80]!r}")
    return value


class BlobRefDict(TypedDict):
    """A :class:`BlobRef` as JSON (:meth:`BlobRef.to_dict`)."""

    sha256: str
    size: int
    media_type: str
    namespace: str


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A pointer to one blob: its SHA-256, size, media type and namespace.

    Blobs are content-addressed within a namespace (the stream they belong to; ``""``
    for none): the key is conceptually ``f"{namespace}/{sha256}"``. A ref is a plain
    value, stored in events as :meth:`to_dict` and read back with :meth:`from_dict`.
    Every field is validated on construction (``TypeError`` / ``ValueError``).
    """

    sha256: str
    size: int
    media_type: str = DEFAULT_MEDIA_TYPE
    namespace: str = ""

    def __post_init__(self) -> None:
        check_sha256(self.sha256)
        if not isinstance(self.size, int) or isinstance(self.size, bool):
            raise TypeError(f"size must be an int, not {type(self.size).__name__}")
        if self.size < 0:
            raise ValueError(f"size must be >= 0, got {self.size}")
        check_media_type(self.media_type)
        check_namespace(self.namespace)

    @classmethod
    def for_bytes(cls, data: bytes, media_type: str = DEFAULT_MEDIA_TYPE, *, namespace: str = "") -> BlobRef:
        """The ref that ``data`` would get when stored under ``namespace``."""
        return cls(hashlib.sha256(data).hexdigest(), len(data), media_type, namespace)

    @property
    def key(self) -> str:
        """``namespace/sha256``: the blob's identity (not a storage path)."""
        return f"{self.namespace}/{self.sha256}"

    def verify(self, data: bytes) -> bytes:
        """Return ``data`` if it is this blob's content, else raise ``BlobIntegrityError``."""
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != self.size or digest != self.sha256:
            raise BlobIntegrityError(
                f"blob {self.key!r} is corrupt: expected sha256 {self.sha256} "
                f"({self.size} bytes), read sha256 {digest} ({len(data)} bytes)"
            )
        return data

    def to_dict(self) -> BlobRefDict:
        """The JSON form stored in an event's ``blobs``."""
        return {
            "sha256": self.sha256,
            "size": self.size,
            "media_type": self.media_type,
            "namespace": self.namespace,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BlobRef:
        """Read back :meth:`to_dict` output; unknown keys are ignored (forward compat)."""
        if not isinstance(d, Mapping):
            raise TypeError(f"a BlobRef is read from a mapping, not {type(d).__name__}")
        try:
            sha256, size = d["sha256"], d["size"]
        except KeyError as e:
            raise ValueError(f"BlobRef dict is missing {e.args[0]!r}") from None
        return cls(
            sha256=sha256,
            size=size,
            media_type=d.get("media_type", DEFAULT_MEDIA_TYPE),
            namespace=d.get("namespace", ""),
        )


def as_ref(ref: object) -> BlobRef:
    """Return ``ref`` re-validated, so a forged ref (built with ``object.__setattr__``
    or a look-alike class) cannot smuggle a bad hash into a path or key."""
    if not isinstance(ref, BlobRef):
        raise TypeError(f"expected a BlobRef, not {type(ref).__name__}")
    ref.__post_init__()
    return ref


def as_bytes(data: object) -> bytes:
    """``bytes`` from any bytes-like ``data``; ``TypeError`` for ``str`` and the rest."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"blob data must be bytes, not {type(data).__name__}")
