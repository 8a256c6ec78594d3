"""Typed tool calls and their results, the data that crosses parser -> executor -> rollout."""

from __future__ import annotations

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
