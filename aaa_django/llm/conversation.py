"""``CONVERSATION``: the whole conversation of each thread, rebuilt from delta requests.

An ``aaa.llm.requested`` carries only the messages added since the thread's previous
request; the reply comes from its ``aaa.llm.completed``. Folding both gives the
conversation, so the log grows linearly with it.

The state is built for long conversations read on every request: each thread is an
append-only list shared between copies of the state (a copy costs O(1), not O(n)),
plus the length this state sees; a state that diverges from the shared list copies
its prefix first. No snapshots (a transcript is not compact state): the in-process
holder keeps it warm, and a cold process folds it once.
"""

from __future__ import annotations

from collections import OrderedDict

from aaa_django.events import Event, Projection
from aaa_django.runtime import Engine
from aaa_django.runtime.event_types import LLM_COMPLETED, LLM_REQUESTED

from .messages import Message

#: requests whose conversation a state remembers (a redelivered older request is
#: rebuilt by a fold up to it)
RECENT = 64


class Conversation:
    """Threads of messages, and the conversation each recent request saw."""

    __slots__ = ("threads", "at")

    def __init__(self) -> None:
        #: thread -> (shared list, length seen by this state)
        self.threads: dict[str, tuple[list[Message], int]] = {}
        #: request id -> (shared list, length at the request)
        self.at: OrderedDict[str, tuple[list[Message], int]] = OrderedDict()

    def __deepcopy__(self, memo: dict) -> Conversation:
        new = Conversation()
        new.threads = dict(self.threads)
        new.at = OrderedDict(self.at)
        return new

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Conversation):
            return NotImplemented
        return self.snapshot() == other.snapshot()

    def snapshot(self) -> dict[str, list[Message]]:
        """Every thread's messages (a copy)."""
        return {t: lst[:n] for t, (lst, n) in self.threads.items()}

    def push(self, thread: str, message: Message) -> None:
        lst, n = self.threads.get(thread) or ([], 0)
        if len(lst) == n:
            lst.append(message)
        elif lst[n] != message:  # another reader went elsewhere: stop sharing
            lst = lst[:n] + [message]
        self.threads[thread] = (lst, n + 1)

    def mark(self, request_id: str, thread: str) -> None:
        self.at[request_id] = self.threads.get(thread) or ([], 0)
        while len(self.at) > RECENT:
            self.at.popitem(last=False)

    def messages(self, thread: str = "main") -> list[Message]:
        """The thread's conversation so far."""
        lst, n = self.threads.get(thread) or ([], 0)
        return lst[:n]

    def request(self, request_id: str) -> list[Message] | None:
        """The whole conversation sent with request ``request_id`` (None if it is not
        a recent request of this state)."""
        got = self.at.get(request_id)
        return got[0][: got[1]] if got is not None else None


def apply(state: Conversation, e: Event) -> Conversation:
    if e.type == LLM_REQUESTED:
        thread = e.data.get("thread") or "main"
        for m in e.data.get("messages") or ():
            state.push(thread, Message.model_validate(m))
        state.mark(e.id, thread)
    elif e.type == LLM_COMPLETED:
        message = (e.data.get("response") or {}).get("message")
        if message is not None:
            state.push(e.data.get("thread") or "main", Message.model_validate(message))
    return state


CONVERSATION: Projection[Conversation] = Projection(Conversation, apply, name="aaa.llm.CONVERSATION", version=1)


async def conversation_of(engine: Engine, request: Event) -> list[Message]:
    """The whole conversation of an ``aaa.llm.requested`` event."""
    state = await engine.project(CONVERSATION, request.stream)
    messages = state.request(request.id)
    if messages is None:  # an old request delivered again: fold up to it
        state = await CONVERSATION.load(engine.view, request.stream, at=request.seq)
        messages = state.request(request.id) or []
    return messages
