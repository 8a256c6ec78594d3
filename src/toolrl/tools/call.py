"""Typed tool calls and their results, the data that crosses parser -> executor -> rollout.

Every result has an outcome. The failed ones fall in two families that training treats differently:
infrastructure faults (the tool timed out, its server crashed, the transport failed), which say nothing about
the model, and the model's mistakes (a tool that does not exist, arguments the tool rejects).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from toolrl.text import clip

Outcome = Literal[
    "ok", "tool_error", "invalid_arguments", "unknown_tool", "timeout", "unknown", "server_crashed", "transport"
]
OUTCOMES: tuple[Outcome, ...] = (
    "ok",
    "tool_error",
    "invalid_arguments",
    "unknown_tool",
    "timeout",
    "unknown",
    "server_crashed",
    "transport",
)
INFRA_FAULTS: frozenset[str] = frozenset({"timeout", "unknown", "server_crashed", "transport"})
"""The tool, its server or the way to it failed: not the model's doing. `unknown`: a call sent to a process toolrl
does not stop (an MCP server, an HTTP service) had no answer by its deadline: it may still run there."""
MODEL_ERRORS: frozenset[str] = frozenset({"unknown_tool", "invalid_arguments"})
"""The model called a tool that does not exist, or with arguments off the tool's schema (format errors, which
never reach a tool, are counted by the rollout). A tool that raises, ValueError and TypeError included, is a
`tool_error`; a tool that wants to blame the arguments raises `toolrl.tools.InvalidArguments`."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolResult:
    """What goes back to the model: `content` is observation text; `outcome` says how the call ended."""

    call: ToolCall | None
    content: str
    outcome: Outcome = "ok"
    latency_s: float = 0.0
    """From the call's start (its concurrency slot taken) to its result, retries included."""
    setup_s: float = 0.0
    """Of `latency_s`, the time a worker process took to start and import the tool's function before the tool ran
    (outside the call's deadline, which counts the tool's own time)."""
    images: tuple[Any, ...] = ()
    """Images the tool returned with its text (toolrl.tools.images.ToolImage), checked and within limits."""
    value: Any = None
    """The tool's return value, for rewards and environments that check values, not text: the object itself
    when the tool ran in this process (isolation thread, loop or inline: a pydantic model, a dataclass, a dict),
    else what `content` decodes to as JSON, else `content` (a worker process, a server, the cache: only text
    crossed). None for a call that failed."""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"ToolResult.outcome must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")

    @property
    def error(self) -> bool:
        return self.outcome != "ok"

    @property
    def infra_fault(self) -> bool:
        return self.outcome in INFRA_FAULTS


UNKNOWN_TOOL = "Error: unknown tool "
"""How the observation of a call of a tool that is not offered begins (unknown_tool_error)."""


def unknown_tool_error(name: str, known_tools: Collection[str] | None) -> str | None:
    """The observation for a call of a tool that does not exist, or None when `name` is known (or unchecked)."""
    if known_tools is None or name in known_tools:
        return None
    return f"{UNKNOWN_TOOL}{clip(name, 80)!r}; available tools: {', '.join(sorted(known_tools)) or 'none'}"
