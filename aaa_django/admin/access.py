"""Who may see and who may act on a run in the admin.

The same rule as the REST API (``aaa_django.api.auth``): a user sees and acts on the
runs they own; another owner's run needs ``aaa.view_all_runs`` to be seen and the
action's permission to be acted on. The admin adds Django's own gates: only active
staff reach it, and the model permissions say which admin pages exist for them.

=================  =============================  ====================================
What               Permission (or owning the run)  Without it
=================  =============================  ====================================
list / open runs   ``aaa.view_runrecord`` (or any  the Runs page is not offered; only
                   permission below) + owner or    own runs are listed; another run's
                   ``aaa.view_all_runs``           page is a 404
cancel             ``aaa.cancel_run``              no button; POST answers 403
approve / deny     ``aaa.approve_run``             no buttons; POST answers 403
erase              ``aaa.erase_run``               no button; GET/POST answer 403
re-drive           ``aaa.change_runrecord``        no button; POST answers 403
start a run        ``aaa.add_runrecord``           no button; GET/POST answer 403
=================  =============================  ====================================

Events, snapshots and blobs are read-only for everyone, superusers included: there is
no permission that lets the admin write them.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

VIEW = "aaa.view_runrecord"
VIEW_ALL = "aaa.view_all_runs"
START = "aaa.add_runrecord"
ACTIONS = {
    "cancel": "aaa.cancel_run",
    "approve": "aaa.approve_run",
    "erase": "aaa.erase_run",
    "redrive": "aaa.change_runrecord",
}


def is_owner(user: Any, run: Any) -> bool:
    return run.owner_id is not None and run.owner_id == user.pk


def sees_every_run(user: Any) -> bool:
    """Whether the user sees runs they do not own (view-all, or any action on any run)."""
    return user.has_perm(VIEW_ALL) or any(user.has_perm(p) for p in ACTIONS.values())


def may_use_runs(user: Any) -> bool:
    """Whether the admin offers the Runs pages to this user at all."""
    if not (user.is_active and user.is_staff):
        return False
    return user.has_perm(VIEW) or user.has_perm(START) or sees_every_run(user)


def visible(user: Any, runs: QuerySet) -> QuerySet:
    """The runs of ``runs`` the user may see."""
    return runs if sees_every_run(user) else runs.filter(owner=user)


def may_view(user: Any, run: Any) -> bool:
    return may_use_runs(user) and (is_owner(user, run) or sees_every_run(user))


def may_act(user: Any, run: Any, action: str) -> bool:
    """Whether the user may ``action`` (cancel, approve, erase, redrive) this run."""
    return may_use_runs(user) and (is_owner(user, run) or user.has_perm(ACTIONS[action]))


def may_start(user: Any) -> bool:
    return bool(user.is_active and user.is_staff and user.has_perm(START))


def allowed_actions(user: Any, run: Any) -> dict[str, bool]:
    """``{"cancel": bool, ...}`` for templates."""
    return {name: may_act(user, run, name) for name in ACTIONS}
