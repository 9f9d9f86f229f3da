"""The type of JSON values, for payloads and bodies whose shape is open.

A shape we own is a ``TypedDict`` or a dataclass; these aliases are for what is only
known to be JSON (an event's data, a tool's arguments, a parsed request body).
Not for pydantic fields: pydantic cannot resolve these string aliases (a field keeps
``dict[str, Any]``).
"""

from __future__ import annotations

from typing import TypeAlias

#: a JSON scalar
JSONScalar: TypeAlias = "str | int | float | bool | None"
#: any JSON value (what ``json.loads`` returns, what ``json.dumps`` accepts)
JSONValue: TypeAlias = "JSONScalar | list[JSONValue] | dict[str, JSONValue]"
#: a JSON object
JSONObject: TypeAlias = "dict[str, JSONValue]"
