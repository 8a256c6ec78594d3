"""A tool made from a typed Python function: JSON schema from type hints and docstring, validated calls."""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from toolrl.errors import ToolError

_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into the description and per-argument descriptions."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section = "description"
    current: str | None = None
    for line in lines:
        header = line.strip().rstrip(":").lower()
        if line.strip().endswith(":") and header in {"args", "arguments", "parameters", "returns", "raises"}:
            section = header
            current = None
            continue
        if section == "description":
            description.append(line)
        elif section in {"args", "arguments", "parameters"}:
            match = _ARG_LINE.match(line)
            if match and not line.startswith(" " * 8):
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return " ".join(" ".join(description).split()), args


@dataclass
class Tool:
    """A callable the model can invoke; `parameters` is a JSON schema object."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    arguments_model: type[BaseModel] | None = field(default=None, repr=False)

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check and coerce arguments against the schema; raises ValueError with a short message."""
        if self.arguments_model is None:
            return arguments
        try:
            return self.arguments_model.model_validate(arguments).model_dump()
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "arguments"
            raise ValueError(f"invalid argument {where}: {err['msg']}") from None

    async def __call__(self, arguments: dict[str, Any], pool: Executor | None = None) -> Any:
        kwargs = self.validate(arguments)
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        # Synchronous tools run in worker threads (`pool`, else asyncio's default) so they never block the loop.
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(self.fn, **kwargs))


def tool_from_function(
    fn: Callable[..., Any], name: str | None = None, inject: Mapping[str, Any] | None = None
) -> Tool:
    """Build a Tool from a function with type hints on every parameter. Parameters named in `inject` are
    filled with its values on every call and left out of the schema the model sees."""
    tool_name = name or fn.__name__
    description, arg_docs = parse_docstring(fn.__doc__)
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if inject and param.name in inject:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(f"tool {tool_name}: *args/**kwargs cannot be described to a model; name each parameter")
        if param.name not in hints:
            raise ToolError(f"tool {tool_name}: parameter {param.name!r} needs a type hint")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], _field(default, arg_docs.get(param.name)))
    model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("required", [])
    call = functools.partial(fn, **inject) if inject else fn
    return Tool(tool_name, description or tool_name, schema, call, model)


def _field(default: Any, description: str | None) -> Any:
    from pydantic import Field

    return Field(default, description=description) if description else Field(default)
