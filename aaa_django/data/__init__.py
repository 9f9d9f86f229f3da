"""Claim-checked blob storage (pure Python: no Django, no storage SDKs).

- :class:`BlobRef`: the JSON-able pointer an event keeps to its payload.
- :class:`BlobStore`: the protocol (spec 004's four methods), :class:`NamespacedBlobStore`
  the optional capability every store here has; :class:`InMemoryBlobStore` and
  :class:`FileBlobStore` implement it here, ``aaa_django.site.blobs.StorageBlobStore``
  over any Django storage (S3 via django-storages). All three also offer
  :class:`BlobInventory` (listing and ageing every blob: the orphan sweep).
- :func:`claim` / :func:`hydrate`: move a large ``dict`` payload into a store and
  back, leaving a ``{"$claim": true, <hot fields>}`` stub in the event.
"""

from .claims import (
    CLAIM_MARKER,
    DEFAULT_CLAIM_THRESHOLD,
    DEFAULT_HOT_FIELDS,
    canonical_json,
    claim,
    hydrate,
    is_claimed,
)
from .errors import BlobError, BlobIntegrityError, BlobNotFoundError, BlobStoreUnavailable
from .files import FileBlobStore
from .memory import InMemoryBlobStore
from .protocol import BlobInventory, BlobReader, BlobStore, NamespacedBlobStore
from .refs import DEFAULT_MEDIA_TYPE, BlobRef

__all__ = [
    "CLAIM_MARKER",
    "DEFAULT_CLAIM_THRESHOLD",
    "DEFAULT_HOT_FIELDS",
    "DEFAULT_MEDIA_TYPE",
    "BlobError",
    "BlobIntegrityError",
    "BlobInventory",
    "BlobReader",
    "BlobNotFoundError",
    "BlobRef",
    "BlobStoreUnavailable",
    "BlobStore",
    "FileBlobStore",
    "InMemoryBlobStore",
    "NamespacedBlobStore",
    "canonical_json",
    "claim",
    "hydrate",
    "is_claimed",
]
