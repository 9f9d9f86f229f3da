"""The one rule of who sees and who acts on a run (``aaa_django.access``), which the
REST API (404/403) and the admin (404/403, buttons) both apply."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from aaa_django.access import ACTIONS, VIEW_ALL, Verdict, allowed_actions, check

ALICE = 1


@dataclass
class User:
    pk: int
    perms: frozenset[str] = frozenset()

    def has_perm(self, perm: str) -> bool:
        return perm in self.perms


def someone(*perms: str) -> User:
    return User(pk=2, perms=frozenset(perms))


@pytest.mark.parametrize(
    "user,owner,action,verdict",
    [
        # the owner sees and does anything to their run
        (User(ALICE), ALICE, None, Verdict.ALLOWED),
        (User(ALICE), ALICE, "erase", Verdict.ALLOWED),
        # anyone else: another owner's run is not found, as an unknown id would be
        (someone(), ALICE, None, Verdict.NOT_FOUND),
        (someone(), ALICE, "cancel", Verdict.NOT_FOUND),
        # view-all sees it, and acting still needs the action's permission
        (someone(VIEW_ALL), ALICE, None, Verdict.ALLOWED),
        (someone(VIEW_ALL), ALICE, "approve", Verdict.FORBIDDEN),
        (someone(VIEW_ALL, ACTIONS["approve"]), ALICE, "approve", Verdict.ALLOWED),
        # an action's permission acts on a run given by id, and shows nothing else
        (someone(ACTIONS["erase"]), ALICE, "erase", Verdict.ALLOWED),
        (someone(ACTIONS["erase"]), ALICE, None, Verdict.NOT_FOUND),
        (someone(ACTIONS["erase"]), ALICE, "cancel", Verdict.NOT_FOUND),
        # a run without an owner is nobody's: only permissions count
        (User(ALICE), None, None, Verdict.NOT_FOUND),
        (someone(VIEW_ALL), None, "cancel", Verdict.FORBIDDEN),
    ],
)
def test_who_sees_and_who_acts(user, owner, action, verdict):
    assert check(user, owner, action) is verdict


def test_allowed_actions_name_every_action():
    assert allowed_actions(User(ALICE), ALICE) == dict.fromkeys(ACTIONS, True)
    # closing a conversation ends it as a cancellation does: the same permission
    assert allowed_actions(someone(VIEW_ALL, ACTIONS["cancel"]), ALICE) == {
        "cancel": True,
        "close": True,
        "approve": False,
        "answer": False,
        "erase": False,
        "redrive": False,
    }
