"""``@tool``: a Python function as a tool, with its JSON schema and execution limits.

The parameter schema comes from the type hints (through pydantic) and the descriptions
from the docstring (first paragraph; ``Args:`` lines for the parameters). Sync tools
run in a worker thread unless ``inline=True``; async tools run on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model

from aaa_django.data.jsonvalue import JSONObject, JSONValue

_ANY = TypeAdapter(Any)

#: how a :class:`SchemaTool` is run: ``call(args, idempotency_key)``, awaited
SchemaCall = Callable[[dict[str, object], str | None], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """The tool execution guard, for tools with side effects.

    With ``side_effects=True`` the handler appends ``aaa.tool.started`` (the intent)
    before the call, and passes a deterministic idempotency key (derived from the
    request id) as the parameter ``key_param`` if the function declares it. After a
    crash, a request with an intent and no result is run again with the same key if
    the tool is ``idempotent``, else it fails with reason ``uncertain``: never a
    silent second execution.
    """

    side_effects: bool = False
    idempotent: bool = False
    key_param: str = "idempotency_key"


class Tool:
    """A callable tool: ``name``, ``description``, ``parameters`` (a pydantic model)
    and how to run it (``timeout``, ``pool``, ``requires_approval``, ``guard``)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        pool: str | None = None,
        requires_approval: bool = False,
        approval_expires: float | None = None,
        guard: GuardConfig | None = None,
        inline: bool = False,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        summary, arg_docs = _parse_doc(inspect.getdoc(fn) or "")
        self.description = description if description is not None else summary
        self.timeout = timeout
        self.pool = pool
        self.requires_approval = requires_approval
        self.approval_expires = approval_expires
        self.guard = guard or GuardConfig()
        self.inline = inline
        self.is_async = inspect.iscoroutinefunction(fn)
        self._takes_key = False
        self.parameters = self._model(arg_docs)
        #: (the parameters model, its JSON schema as text): pydantic builds a schema in
        #: about 0.1 ms, and every run that offers the tool asks for its spec
        self._schema: tuple[type[BaseModel], str] | None = None

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def _model(self, arg_docs: dict[str, str]) -> type[BaseModel]:
        fields: dict[str, Any] = {}
        for p in inspect.signature(self.fn).parameters.values():
            if p.name == self.guard.key_param:
                self._takes_key = True
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            annotation = p.annotation if p.annotation is not p.empty else Any
            default = p.default if p.default is not p.empty else ...
            fields[p.name] = (annotation, Field(default, description=arg_docs.get(p.name)))
        return create_model(f"{self.name}_args", __config__=ConfigDict(extra="forbid"), **fields)

    def spec(self) -> JSONObject:
        """The JSON tool spec sent to a model: name, description, parameters schema
        (a new dict each time: the caller may keep or change it)."""
        if self._schema is None or self._schema[0] is not self.parameters:
            schema = self.parameters.model_json_schema()
            schema.pop("title", None)
            for prop in schema.get("properties", {}).values():
                prop.pop("title", None)
            self._schema = (self.parameters, json.dumps(schema))
        return {"name": self.name, "description": self.description, "parameters": json.loads(self._schema[1])}

    def validate(self, args: Mapping[str, object]) -> dict[str, object]:
        """Arguments checked and converted; raises pydantic ``ValidationError``."""
        model = self.parameters.model_validate(args)
        return {k: getattr(model, k) for k in type(model).model_fields}

    async def invoke(self, args: Mapping[str, object], *, idempotency_key: str | None = None) -> JSONValue:
        """Run the tool with validated ``args``; return a JSON-ready result."""
        kwargs = dict(args)
        if self._takes_key:
            kwargs[self.guard.key_param] = idempotency_key
        if self.is_async:
            result = await self.fn(**kwargs)
        elif self.inline:
            result = self.fn(**kwargs)
        else:
            result = await asyncio.to_thread(self.fn, **kwargs)
        return result if isinstance(result, str) else _ANY.dump_python(result, mode="json")


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    pool: str | None = None,
    requires_approval: bool = False,
    approval_expires: float | None = None,
    side_effects: bool = False,
    idempotent: bool = False,
    guard: GuardConfig | None = None,
    inline: bool = False,
) -> Any:
    """Make a function a :class:`Tool`: ``@tool`` or ``@tool(timeout=5, pool="db")``.

    ``timeout``: seconds before the call fails with reason ``timeout``; ``pool``: a
    named concurrency pool (sized by ``ToolHandler(pools=...)``);
    ``requires_approval``: wait for ``engine.approve``/``deny`` (``approval_expires``
    seconds, then it counts as denied); ``side_effects`` / ``idempotent``: the
    execution guard (see :class:`GuardConfig`); ``inline``: run a sync function on the
    event loop instead of a thread (only for trivial, non-blocking functions).
    """

    def make(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            timeout=timeout,
            pool=pool,
            requires_approval=requires_approval,
            approval_expires=approval_expires,
            guard=guard or GuardConfig(side_effects=side_effects, idempotent=idempotent),
            inline=inline,
        )

    return make(fn) if fn is not None else make


_SECTION_RE = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?):\s*$")
_ARG_RE = re.compile(r"^\s+(\*{0,2}\w+)\s*(\([^)]*\))?:\s*(.*)$")


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {param: description}) from a Google-style docstring."""
    summary_lines: list[str] = []
    args: dict[str, str] = {}
    section = None
    current = None
    for line in doc.splitlines():
        if _SECTION_RE.match(line.strip()):
            section = line.strip()[:-1]
            current = None
            continue
        if section is None:
            summary_lines.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            am = _ARG_RE.match(line)
            if am:
                current = am.group(1).lstrip("*")
                args[current] = am.group(3).strip()
            elif current and line.strip():
                args[current] = (args[current] + " " + line.strip()).strip()
    summary = "\n".join(summary_lines).strip().split("\n\n")[0].replace("\n", " ")
    return summary, args


class SchemaTool(Tool):
    """A tool described by a JSON schema rather than a Python signature: what another
    system (an MCP server, a Pydantic AI agent) says its tool takes. ``call(args,
    idempotency_key)`` is awaited to run it; ``check(args)``, if given, raises pydantic's
    ``ValidationError`` for arguments the tool would refuse (else the tool's own side
    checks them). The limits (``timeout``, ``pool``, approvals, the guard) are ours, as for
    any tool."""

    def __init__(
        self,
        name: str,
        parameters: Mapping[str, JSONValue],
        call: SchemaCall,
        *,
        description: str = "",
        check: Callable[[Mapping[str, object]], object] | None = None,
        timeout: float | None = None,
        pool: str | None = None,
        requires_approval: bool = False,
        approval_expires: float | None = None,
        guard: GuardConfig | None = None,
    ) -> None:
        self.fn = call
        self.name = name
        self.description = description
        self.schema: JSONObject = dict(parameters or {"type": "object", "properties": {}})
        self.check = check
        self.timeout = timeout
        self.pool = pool
        self.requires_approval = requires_approval
        self.approval_expires = approval_expires
        self.guard = guard or GuardConfig()
        self.inline = False
        self.is_async = True
        self._takes_key = True

    def spec(self) -> JSONObject:
        return {"name": self.name, "description": self.description, "parameters": self.schema}

    def validate(self, args: Mapping[str, object]) -> dict[str, object]:
        if self.check is not None:
            self.check(args)
        return dict(args)

    async def invoke(self, args: Mapping[str, object], *, idempotency_key: str | None = None) -> JSONValue:
        result = await self.fn(dict(args), idempotency_key)
        return result if isinstance(result, str) else _ANY.dump_python(result, mode="json")
