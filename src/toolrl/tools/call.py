"""Typed tool calls and their results, the data that crosses parser -> executor -> rollout."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolResult:
    """What goes back to the model: `content` is observation text; `error` marks a failed call."""

    call: ToolCall | None
    content: str
    error: bool = False


def unknown_tool_error(name: str, known_tools: Collection[str] | None) -> str | None:
    """The observation for a call of a tool that does not exist, or None when `name` is known (or unchecked)."""
    if known_tools is None or name in known_tools:
        return None
    return f"Error: unknown tool {name!r}; available tools: {', '.join(sorted(known_tools)) or 'none'}"


def first_line(exc: BaseException) -> str:
    """An exception as one line for an observation or a status: its first line, else its type name."""
    text = str(exc)
    return text.splitlines()[0] if text.strip() else type(exc).__name__
