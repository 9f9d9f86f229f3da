"""The claim check: move a large event payload into a blob store, leave a stub.

These helpers work on plain ``dict`` payloads; the event layer decides which events
are claim-checked (never ``aaa.run.completed``) and keeps the returned ref in the
event's ``blobs``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import cast

from .errors import BlobError
from .jsonvalue import JSONObject
from .protocol import BlobReader, BlobStore, NamespacedBlobStore
from .refs import BlobRef

DEFAULT_CLAIM_THRESHOLD = 16_384
"""Bytes of canonical JSON above which a payload is claim-checked (16 KiB)."""

DEFAULT_HOT_FIELDS: tuple[str, ...] = ("usage", "cost", "tag", "call_id", "name")
"""Fields a stub keeps, so spend accounting and correlation never fetch a blob."""

CLAIM_MARKER = "$claim"
CLAIM_MEDIA_TYPE = "application/json"
#: the key naming the stream in a payload stored in a store without namespaces (see
#: :func:`put_claim`); the payload itself is under ``"data"``
STREAM_KEY = "$stream"


def canonical_json(data: object) -> bytes:
    """``data`` as canonical JSON in UTF-8: sorted keys, no spaces, no NaN/Infinity.

    The claim threshold is measured on exactly these bytes, and they are what the blob
    holds. Raises ``TypeError`` / ``ValueError`` for data that is not strict JSON.
    """
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def is_claimed(data: object) -> bool:
    """True if ``data`` is a claim stub (``"$claim": true``) whose payload is in a blob."""
    return isinstance(data, dict) and data.get(CLAIM_MARKER) is True


def claim(
    data: JSONObject,
    *,
    store: BlobStore,
    namespace: str,
    threshold: int,
    hot_fields: Iterable[str] = DEFAULT_HOT_FIELDS,
) -> tuple[JSONObject, BlobRef | None]:
    """Claim-check ``data`` if its canonical JSON is longer than ``threshold`` bytes.

    Returns ``(data, None)`` when it is small enough (``data`` itself, untouched), else
    ``({"$claim": True, <hot fields present in data>}, ref)`` after putting the JSON in
    ``store`` under ``namespace`` (the stream) with media type ``application/json``.

    A payload that itself has a ``"$claim"`` key is always claim-checked, whatever
    its size, so that a stub can never be confused with ordinary data. A store without
    namespaces (a plain :class:`BlobStore`) gets the payload with its namespace in it
    (see :func:`put_claim`).
    """
    raw = claim_payload(data, threshold)
    if raw is None:
        return data, None
    return put_claim(
        data,
        raw,
        store=store,
        namespace=namespace,
        hot_fields=hot_fields,
        namespaced=isinstance(store, NamespacedBlobStore),
    )


def claim_payload(data: JSONObject, threshold: int) -> bytes | None:
    """The canonical JSON :func:`claim` would put in a blob store, or None when ``data``
    stays in the event. Pure (no store): a caller whose store call costs a thread hop
    can decide first, and make the call only for a payload to write."""
    if not isinstance(data, dict):
        raise TypeError(f"claim() takes a dict, not {type(data).__name__}")
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
        raise ValueError(f"threshold must be an int >= 0, got {threshold!r}")
    raw = canonical_json(data)
    if len(raw) <= threshold and CLAIM_MARKER not in data:
        return None
    return raw


def put_claim(
    data: JSONObject,
    raw: bytes,
    *,
    store: BlobStore,
    namespace: str,
    hot_fields: Iterable[str] = DEFAULT_HOT_FIELDS,
    namespaced: bool = True,
) -> tuple[JSONObject, BlobRef]:
    """Put ``raw`` (``claim_payload(data, ...)``) in ``store``; the stub and its ref.

    ``namespaced``: the store is a :class:`NamespacedBlobStore` (the caller detects it
    once). A plain store (spec 004's ``put(data, media_type)``) gets
    ``{"$stream": namespace, "data": data}`` instead, so identical payloads of two
    streams are still two blobs and erasing one stream's never removes another's;
    :func:`hydrate` unwraps it."""
    if namespaced:  # (the caller detected it once)
        ref = cast(NamespacedBlobStore, store).put(raw, CLAIM_MEDIA_TYPE, namespace=namespace)
    else:
        ref = store.put(canonical_json({STREAM_KEY: namespace, "data": data}), CLAIM_MEDIA_TYPE)
    stub = {CLAIM_MARKER: True, **{k: data[k] for k in hot_fields if k in data}}
    return stub, ref


def hydrate(data: JSONObject, ref: BlobRef | None, *, store: BlobReader) -> JSONObject:
    """The full payload behind a stub (fetched and verified), or ``data`` unchanged.

    Raises ``BlobNotFoundError`` / ``BlobIntegrityError`` from the store, ``ValueError``
    for a stub without a ref, and ``BlobError`` if the blob is not a JSON object.
    """
    if not is_claimed(data):
        return data
    if ref is None:
        raise ValueError("a claim stub needs the BlobRef of its payload, got None")
    try:
        full = json.loads(store.get(ref))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BlobError(f"claimed blob {ref.key!r} is not JSON: {e}") from None
    if not ref.namespace and isinstance(full, dict) and full.keys() == {STREAM_KEY, "data"}:
        full = full["data"]  # a payload put in a store without namespaces (see put_claim)
    if not isinstance(full, dict):
        raise BlobError(f"claimed blob {ref.key!r} holds a {type(full).__name__}, not an object")
    return full
