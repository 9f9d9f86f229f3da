"""A run's events as the REST API and the admin show them: claim-checked payloads
restored from the site's blob store, verified.

- :func:`hydrated`: one event, hydrated (sync: for views);
- :func:`hydrating`: a store whose reads come back hydrated, for folding projections
  (the engine's :class:`~aaa_django.runtime.view.HydratedView`, over the site's blobs).
"""

from __future__ import annotations

from dataclasses import replace

from aaa_django.data import BlobStore, hydrate, is_claimed
from aaa_django.data.errors import BlobError
from aaa_django.events import Event, EventStore
from aaa_django.runtime.view import HydratedView
from aaa_django.site.engines import site_blobs


def hydrated(event: Event, blobs: BlobStore | None = None) -> Event:
    """The event with its claim-checked payload restored (verified) from ``blobs``
    (default: the site's); raises :class:`~aaa_django.data.BlobError`."""
    if not is_claimed(event.data):
        return event
    if blobs is None:
        blobs = site_blobs()
    if blobs is None:
        raise BlobError(f"event {event.id} is claim-checked but this site has no blob store (AAA['BLOB_STORAGE'])")
    if not event.blobs:
        raise BlobError(f"event {event.id} is claim-checked but names no blob")
    return replace(event, data=hydrate(event.data, event.blobs[-1], store=blobs))


def hydrating(store: EventStore, blobs: BlobStore | None = None) -> HydratedView:
    """``store``, its reads hydrated from ``blobs`` (default: the site's, looked up
    only when a claim-checked event is read)."""
    found = blobs

    async def one(event: Event) -> Event:
        nonlocal found
        if found is None and is_claimed(event.data):
            found = site_blobs()
        return hydrated(event, found)

    return HydratedView(store, one)
