"""The Django admin of aaa_django: runs, their timelines, projections and blobs.

Registered on ``django.contrib.admin.site`` when the app is installed (Django's
admin autodiscovery imports this package):

- **Runs** (:class:`~aaa_django.admin.runs.RunAdmin`): the run list, the run page,
  the actions (cancel, approve/deny, erase, re-drive, start), all through the engine.
- **Events** and **Snapshots**: read-only, for everyone.

A site with its own ``AdminSite`` registers the same classes on it:
``my_site.register(RunRecord, RunAdmin)``. Who may see and act is in
:mod:`aaa_django.admin.access`.
"""

from django.contrib import admin

from aaa_django.models import EventRecord, RunRecord, SnapshotRecord

from .records import EventAdmin, SnapshotAdmin
from .runs import RunAdmin

# The built-in algorithms, so the start form offers them in any process.
import aaa_django.algos  # noqa: E402,F401

admin.site.register(RunRecord, RunAdmin)
admin.site.register(EventRecord, EventAdmin)
admin.site.register(SnapshotRecord, SnapshotAdmin)

__all__ = ["EventAdmin", "RunAdmin", "SnapshotAdmin"]
