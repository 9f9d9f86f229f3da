"""Build the engine a Django site configured: its database, its blob storage.

The core :class:`~aaa_django.runtime.Engine` knows nothing of Django; this adapter
hands it the Django ORM store and, when ``AAA["BLOB_STORAGE"]`` names a ``STORAGES``
alias, a blob store over that storage (django-storages' S3 included).
"""

from __future__ import annotations

from typing import Any

from .conf import aaa_settings
from .events import default_cache


def build_engine(*, using: str = "default", **overrides: Any):
    """An :class:`~aaa_django.runtime.Engine` over the site's database and storage.

    ``overrides`` go to the Engine as they are (``bus=...``, ``blobs=...``, ...). The
    bus is the one ``AAA["BUS"]`` names unless given: with ``"celery"``, a
    :class:`~aaa_django.bus.DistributedBus`.
    Use it as ``async with build_engine() as engine:``.
    """
    from .blobs import StorageBlobStore
    from .runtime import Engine
    from .store import DjangoEventStore

    conf = aaa_settings()
    default_cache.check_every = conf["FOLD_CHECK_EVERY"]
    blobs = StorageBlobStore(alias=conf["BLOB_STORAGE"]) if conf["BLOB_STORAGE"] else None
    options: dict[str, Any] = {
        "store": DjangoEventStore(using),
        "blobs": blobs,
        "claim_threshold": conf["CLAIM_THRESHOLD"],
    }
    if conf["BUS"] == "celery" and "bus" not in overrides:
        from .bus import DistributedBus  # the cluster: deliveries are Celery tasks

        options["bus"] = DistributedBus()
    options.update(overrides)
    return Engine(**options)
