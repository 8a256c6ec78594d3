"""The parser interface and registry: model text in, tool calls and format errors out, never an exception."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from toolrl.registry import Registry
from toolrl.tools.call import ToolCall, unknown_tool_error


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One-line format-error observations for the model, one per malformed call."""


Parser = Callable[[str, Collection[str] | None], ParseResult]
PARSERS: Registry[Parser] = Registry("parser", "rollout.parser")
register_parser = PARSERS.register


def get_parser(name: str) -> Parser:
    return PARSERS.lookup(name)


def call_from_object(
    data: Any, known_tools: Collection[str] | None, expected: str
) -> tuple[ToolCall | None, str | None]:
    """A decoded `{"name": ..., "arguments" | "parameters": {...}}` as a call, or a one-line error."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None, f'Error: tool call needs a "name" string; {expected}'
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, f"Error: the arguments of {data['name']} are not a JSON object; {expected}"
    if not isinstance(arguments, dict):
        return None, f"Error: the arguments of {data['name']} must be a JSON object; {expected}"
    error = unknown_tool_error(data["name"], known_tools)
    return (None, error) if error else (ToolCall(data["name"], arguments), None)
