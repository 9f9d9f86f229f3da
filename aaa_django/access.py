"""Who may start runs, see a run and act on it: the one rule of the REST API and the admin.

- **Starting** a run (it spends the site's model budget) needs ``aaa.add_runrecord``
  (:data:`START`), over the API and in the admin alike.
- A run's **owner** sees it and acts on it.
- Anyone else needs ``aaa.view_all_runs`` to **see** it (lists, pages, reads, streams).
  A run the caller may not see is *not found*, exactly like an unknown id, so ids do
  not leak.
- Anyone else needs the action's permission to **act** on it (:data:`ACTIONS`). A
  caller who may see the run but not act is *forbidden*; one who holds the action's
  permission may act on a run it was given by id even without seeing it (an eraser
  need not be able to read what it erases).

A run without an owner (started by a command or a worker) is nobody's: only the
permissions apply. ``user`` is anything with ``pk`` and ``has_perm`` (a Django user);
the API and the admin map :class:`Verdict` to 404 and 403 each in its own way.
"""

from __future__ import annotations

import enum
from typing import Protocol

from django.db.models import QuerySet

#: starting runs: Django's "add" permission of the run index (no migration, and the
#: admin's Start button already asked for it)
START = "aaa.add_runrecord"
VIEW_ALL = "aaa.view_all_runs"
#: every action on a run, and the permission it needs on another owner's run
ACTIONS = {
    "cancel": "aaa.cancel_run",
    "close": "aaa.cancel_run",
    "approve": "aaa.approve_run",
    "answer": "aaa.answer_run",
    "erase": "aaa.erase_run",
    "redrive": "aaa.change_runrecord",
}


class User(Protocol):
    """What these rules read of a user: its ``pk`` and ``has_perm`` (a Django user)."""

    @property
    def pk(self) -> object: ...

    def has_perm(self, perm: str, obj: object = None) -> bool: ...


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    NOT_FOUND = "not_found"  # may not see the run: answer as for an unknown id
    FORBIDDEN = "forbidden"  # may see the run, may not do this to it


def may_start(user: User) -> bool:
    """Whether the user may start runs."""
    return bool(user.has_perm(START))


def owns(user: User, owner_id: object) -> bool:
    return owner_id is not None and owner_id == user.pk


def sees_all(user: User) -> bool:
    """Whether the user sees every run, not only their own."""
    return bool(user.has_perm(VIEW_ALL))


def may_see(user: User, owner_id: object) -> bool:
    return owns(user, owner_id) or sees_all(user)


def may_act(user: User, owner_id: object, action: str) -> bool:
    """Whether the user may ``action`` (a key of :data:`ACTIONS`) a run of ``owner_id``."""
    return owns(user, owner_id) or bool(user.has_perm(ACTIONS[action]))


def check(user: User, owner_id: object, action: str | None = None) -> Verdict:
    """The verdict on reading (``action`` None) or acting on a run of ``owner_id``."""
    if action is not None and may_act(user, owner_id, action):
        return Verdict.ALLOWED
    if not may_see(user, owner_id):
        return Verdict.NOT_FOUND
    return Verdict.ALLOWED if action is None else Verdict.FORBIDDEN


def visible(user: User, runs: QuerySet) -> QuerySet:
    """The runs of ``runs`` (a ``RunRecord`` queryset) the user may see."""
    return runs if sees_all(user) else runs.filter(owner_id=user.pk)


def allowed_actions(user: User, owner_id: object) -> dict[str, bool]:
    """``{"cancel": bool, ...}``: what the user may do to a run of ``owner_id``."""
    return {name: may_act(user, owner_id, name) for name in ACTIONS}
