"""The app's settings: one ``AAA = {...}`` dict in the site's settings.

Every key is optional; a site sets only what it changes, and the rest comes from
``DEFAULTS``. Read the merged dict with :func:`aaa_settings` (read on every call, so
``override_settings(AAA=...)`` in tests is seen at once). The system checks in
``aaa_django.checks`` validate the dict at start-up.

==================  ===============  ============  ==========================================
Key                 Type             Default       Meaning
==================  ===============  ============  ==========================================
BUS                 str              "inprocess"   How appended events are delivered:
                                                   "inprocess" (asyncio, in the web or
                                                   command process) or "celery" (workers).
CLAIM_THRESHOLD     int >= 0         16384         An event whose JSON ``data`` is larger
                                                   than this many bytes is claim-checked:
                                                   its payload moves to the blob store.
BLOB_STORAGE        str or None      None          An alias in the site's ``STORAGES`` that
                                                   holds claim-checked blobs (e.g. an S3
                                                   bucket via django-storages). None: no
                                                   blob store, nothing is claim-checked.
SNAPSHOT_EVERY      int >= 0         64            Save a projection snapshot every this many
                                                   events of a stream; 0 never snapshots.
FOLD_CHECK_EVERY    int >= 0         100           Every this many incremental folds, check
                                                   the cached state against a whole-log fold;
                                                   0 never checks.
==================  ===============  ============  ==========================================
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "BUS": "inprocess",
    "CLAIM_THRESHOLD": 16384,
    "BLOB_STORAGE": None,
    "SNAPSHOT_EVERY": 64,
    "FOLD_CHECK_EVERY": 100,
}

BUSES = frozenset({"inprocess", "celery"})


def site_aaa() -> Any:
    """The raw ``settings.AAA`` value as the site wrote it (``{}`` when unset)."""
    return getattr(settings, "AAA", {})


def aaa_settings() -> dict[str, Any]:
    """The site's ``AAA`` dict merged over ``DEFAULTS``."""
    site = site_aaa()
    return {**DEFAULTS, **(site if isinstance(site, dict) else {})}
