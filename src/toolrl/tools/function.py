"""A tool made from a typed Python function: JSON schema from type hints and docstring, validated calls.

Validation errors name every field that is wrong and why (bounded in length), so that the model can learn
which argument to fix. Where a synchronous tool runs is its isolation: in a worker process (killed when it
overruns its deadline; the default for functions a fresh interpreter can import), or in a thread (for tools
known to return, and for closures and bound methods, which cannot move to another process).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from toolrl.errors import ToolError
from toolrl.text import clip
from toolrl.tools.limits import InvalidArguments, Isolation

_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")
MAX_ERRORS = 5
"""Fields listed in one validation message; more are counted."""


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


def invalid_arguments(problems: list[tuple[str, str]]) -> InvalidArguments:
    """One message for every (field, reason), the first MAX_ERRORS of them spelled out."""
    shown = "; ".join(f"{where}: {reason}" for where, reason in problems[:MAX_ERRORS])
    more = f"; and {len(problems) - MAX_ERRORS} more" if len(problems) > MAX_ERRORS else ""
    noun = "argument" if len(problems) == 1 else "arguments"
    return InvalidArguments(clip(f"invalid {noun}: {shown}{more}"))


def _pydantic_problems(exc: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        reason = err["msg"]
        if err["type"] not in {"missing", "extra_forbidden"}:
            reason += f" (got {clip(repr(err.get('input')), 60)})"
        elif err["type"] == "extra_forbidden":
            reason = "not a parameter of this tool"
        problems.append((where, reason))
    return problems


def json_schema_checker(schema: Mapping[str, Any], where: str) -> Callable[[Mapping[str, Any]], None]:
    """A function that raises InvalidArguments for arguments off `schema`, naming each field; ValueError here
    when `schema` itself is not a valid JSON schema."""
    import jsonschema

    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"{where}: not a valid JSON schema ({exc.message})") from None
    validator = validator_class(schema)

    def check(arguments: Mapping[str, Any]) -> None:
        errors = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
        if errors:
            raise invalid_arguments(
                [(".".join(str(p) for p in e.absolute_path) or "arguments", clip(e.message, 160)) for e in errors]
            )

    return check


@dataclass
class Tool:
    """A callable the model can invoke; `parameters` is a JSON schema object."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    arguments_model: type[BaseModel] | None = field(default=None, repr=False)
    check: Callable[[Mapping[str, Any]], None] | None = field(default=None, repr=False)
    """For tools without an arguments model (MCP, HTTP): raises InvalidArguments for arguments off the schema."""
    idempotent: bool = False
    """Safe to repeat: a failure that may have reached the tool is retried only when this (or the policy's
    `retry`) says so."""
    isolation: Isolation | None = None
    """Where the function runs when it is synchronous; None: a worker process when `target` is set, else a
    thread."""
    target: str | None = None
    """`module:qualname` by which a worker process imports `fn`; None when it cannot (closures, bound methods,
    functions of __main__, partials)."""
    text_only: bool = False
    """Its value arrives as text (an MCP server's result): ToolResult.value is what the text decodes to as
    JSON, as for a tool run in a worker process."""
    runs_elsewhere: bool = False
    """Its calls run in a process toolrl does not stop (an MCP server, an HTTP service): one without an answer by its
    deadline was sent and may still run there, so its outcome is `unknown`, not a plain `timeout`."""

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check and coerce arguments against the schema; raises InvalidArguments naming each wrong field."""
        if self.arguments_model is not None:
            try:
                return self.arguments_model.model_validate(arguments).model_dump()
            except ValidationError as exc:
                raise invalid_arguments(_pydantic_problems(exc)) from None
        if self.check is not None:
            self.check(arguments)
        return arguments

    async def __call__(self, arguments: dict[str, Any]) -> Any:
        """Validate and run once, here (a synchronous function in a thread): for trying a tool by hand. Rollouts
        go through `ToolExecutor`, which adds deadlines, isolation and retries."""
        kwargs = self.validate(arguments)
        if self.is_async:
            return await self.fn(**kwargs)
        return await asyncio.to_thread(functools.partial(self.fn, **kwargs))


def import_target(fn: Callable[..., Any]) -> str | None:
    """`module:qualname` if a fresh interpreter importing it gets this very function, else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname or not inspect.isfunction(fn):
        return None
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if obj is fn else None


def tool_from_function(
    fn: Callable[..., Any],
    name: str | None = None,
    inject: Mapping[str, Any] | None = None,
    *,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    validate: bool = True,
    idempotent: bool = False,
    isolation: Isolation | None = None,
) -> Tool:
    """Build a Tool from a function. By default its name, description and JSON schema come from the function:
    its name, its docstring (Google style `Args:` describe the parameters) and its type hints, needed on every
    parameter; arguments are validated and coerced by those types. Each can be given instead: `name`,
    `description`, and `parameters`, a JSON schema object shown to the model and checked as it is (type hints
    are then not needed: a benchmark's own schema for its own functions). `validate=False` passes the model's
    arguments to the function as written, unchecked (a benchmark that checks them itself; what the function
    raises is the call's error). Parameters named in `inject` are filled with its values on every call and left
    out of the schema. `idempotent` declares the tool safe to repeat after a failure; `isolation` where it runs
    (see `Tool.isolation`)."""
    tool_name = name or getattr(fn, "__name__", None)
    if not isinstance(tool_name, str) or not tool_name:
        raise ToolError(f"tool_from_function({fn!r}): give it a name (name=...)")
    doc, arg_docs = parse_docstring(getattr(fn, "__doc__", None))
    call = functools.partial(fn, **inject) if inject else fn
    target = None if inject else import_target(fn)
    own = dict(idempotent=idempotent, isolation=isolation, target=target)
    if parameters is not None:
        schema = _given_schema(parameters, tool_name, inject or {})
        check = json_schema_checker(schema, f"tool {tool_name}: parameters") if validate else None
        return Tool(tool_name, description or doc or tool_name, schema, call, check=check, **own)
    model = _arguments_model(fn, tool_name, inject or {}, arg_docs)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("required", [])
    return Tool(tool_name, description or doc or tool_name, schema, call, model if validate else None, **own)


def _arguments_model(fn: Callable[..., Any], tool_name: str, inject: Mapping[str, Any], arg_docs) -> type[BaseModel]:
    """The pydantic model of the function's parameters (by their type hints), the injected ones left out."""
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name in inject:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(f"tool {tool_name}: *args/**kwargs cannot be described to a model; name each parameter")
        if param.name not in hints:
            raise ToolError(
                f"tool {tool_name}: parameter {param.name!r} needs a type hint (or give the tool's JSON schema: "
                "parameters=...)"
            )
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], _field(default, arg_docs.get(param.name)))
    return create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)


def _given_schema(parameters: Mapping[str, Any], tool_name: str, inject: Mapping[str, Any]) -> dict[str, Any]:
    """A schema given for a tool: a JSON schema object (`{"type": "object", "properties": {...}}`) that names
    no injected parameter; a one-line ToolError otherwise."""
    schema = dict(parameters) if isinstance(parameters, Mapping) else None
    if schema is None or schema.get("type", "object") != "object" or not isinstance(schema.get("properties", {}), dict):
        shape = '{"type": "object", "properties": ...}'
        raise ToolError(f"tool {tool_name}: parameters is a JSON schema object, {shape}")
    if hidden := sorted(set(schema.get("properties", {})) & set(inject)):
        raise ToolError(f"tool {tool_name}: parameters names {hidden[0]!r}, which is injected; leave it out")
    try:
        json_schema_checker(schema, f"tool {tool_name}: parameters")
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    return {"type": "object", **schema, "properties": dict(schema.get("properties", {}))}


def _field(default: Any, description: str | None) -> Any:
    from pydantic import Field

    return Field(default, description=description) if description else Field(default)
