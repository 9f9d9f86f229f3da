"""What the views need of conversations below the router: a start's ``conversation``
as the engine takes it, and a :class:`~aaa_django.runtime.conversation.ConversationError`
as the API answers it (the one map of its codes to HTTP)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aaa_django.conf import aaa_settings
from aaa_django.runtime.conversation import ConversationError, check_algorithm

from .errors import ApiError, item

#: a ConversationError's code -> the HTTP status it answers (the rest: 409)
STATUS = {"not_found": 404, "invalid": 422, "invalid_answer": 422, "not_conversational": 422}


def refusal(exc: ConversationError, loc: Sequence[str | int]) -> ApiError:
    """The API's answer to a refused conversation action: 404, 422 (with where the
    answer does not fit, under ``loc``) or 409, with the reason."""
    status = STATUS.get(exc.code, 409)
    if exc.errors:
        return ApiError(status, errors=[item([*loc, *e["loc"]], e["msg"], e["type"]) for e in exc.errors])
    return ApiError(status, loc, str(exc), exc.code)


def start_settings(
    algorithm: str, config: Mapping[str, object] | None, conversation: object
) -> dict[str, object] | None:
    """A start's ``conversation`` (true, or ``{"idle": seconds}``) as the engine takes
    it, the idle timeout defaulting to ``AAA["CONVERSATION_IDLE"]``; None when the run
    is not one. 422 when the algorithm holds no conversation."""
    if not conversation:
        return None
    idle = getattr(conversation, "idle", None)
    try:
        check_algorithm(algorithm, config or {})
    except ConversationError as exc:
        raise refusal(exc, ["body", "conversation"]) from None
    return {"idle": idle if idle is not None else aaa_settings()["CONVERSATION_IDLE"]}
