"""The Django admin of aaa_django: runs, their timelines, projections and blobs.

Registered on ``django.contrib.admin.site`` when the app is installed (Django's
admin autodiscovery imports this package):

- **Runs** (:class:`~aaa_django.admin.runs.RunAdmin`): the run list and its actions
  on many runs (:mod:`.bulk`), the run page, the actions on a run (cancel,
  approve/deny, erase, re-drive, run again, fork) and the start form built from the
  algorithm's schemas (:mod:`.startform`), all through the engine.
- **Events** and **Snapshots**: read-only, for everyone.
- **API keys** (:class:`~aaa_django.admin.apikeys.ApiKeyAdmin`): create (the key is
  shown once), list, revoke.

A site with its own ``AdminSite`` registers the same classes on it:
``my_site.register(RunRecord, RunAdmin)``.

Who sees which run and who acts on it is :mod:`aaa_django.access`, the REST API's
rule too: an owner sees and acts on their own runs; another owner's run needs
``aaa.view_all_runs`` to be seen (else 404) and the action's permission to be acted
on (else 403). The admin adds Django's gates: only active staff reach it, and the
model permissions say which pages exist for them.

=================  ==========================================  ========================
What               Permission                                  Without it
=================  ==========================================  ========================
Runs pages         ``aaa.view_runrecord`` (or any below)       not offered (403)
others' runs       ``aaa.view_all_runs``                       own runs only; 404
cancel             ``aaa.cancel_run`` (or owning the run)      no button; POST 403
approve / deny     ``aaa.approve_run`` (or owning the run)     no buttons; POST 403
erase              ``aaa.erase_run`` (or owning the run)       no button; GET/POST 403
re-drive           ``aaa.change_runrecord`` (or owning it)     no button; POST 403
start a run        ``aaa.add_runrecord``                       no button; GET/POST 403
run again, fork    ``aaa.add_runrecord`` and seeing the run    no button; POST 403
bulk cancel /      ``aaa.cancel_run`` / ``change_runrecord``   not offered in the list
re-drive / erase   / ``erase_run``
bulk export        seeing the runs (any user of the list)      (always offered)
API keys           ``aaa.view_apikey`` / ``add_apikey`` /      not offered (403)
                   ``change_apikey`` (revoke, rename)
=================  ==========================================  ========================

Events, snapshots and blobs are read-only for everyone, superusers included: there is
no permission that lets the admin write them.
"""

from django.contrib import admin

# The built-in algorithms, so the start form offers them in any process.
import aaa_django.algos  # noqa: F401
from aaa_django.models import ApiKey, EventRecord, RunRecord, SnapshotRecord

from .apikeys import ApiKeyAdmin
from .records import EventAdmin, SnapshotAdmin
from .runs import RunAdmin

admin.site.register(RunRecord, RunAdmin)
admin.site.register(EventRecord, EventAdmin)
admin.site.register(SnapshotRecord, SnapshotAdmin)
admin.site.register(ApiKey, ApiKeyAdmin)

__all__ = ["ApiKeyAdmin", "EventAdmin", "RunAdmin", "SnapshotAdmin"]
