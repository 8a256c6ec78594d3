"""Typed tool calls and their results, the data that crosses parser -> executor -> rollout.

Every result has an outcome. The failed ones fall in two families that training treats differently:
infrastructure faults (the tool timed out, its server crashed, the transport failed), which say nothing about
the model, and the model's mistakes (a tool that does not exist, arguments the tool rejects).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["ok", "tool_error", "invalid_arguments", "unknown_tool", "timeout", "crashed", "transport"]
OUTCOMES: tuple[Outcome, ...] = (
    "ok",
    "tool_error",
    "invalid_arguments",
    "unknown_tool",
    "timeout",
    "crashed",
    "transport",
)
INFRA_FAULTS: frozenset[str] = frozenset({"timeout", "crashed", "transport"})
"""The tool, its server or the way to it failed: not the model's doing."""
MODEL_ERRORS: frozenset[str] = frozenset({"unknown_tool", "invalid_arguments"})
"""The model called a tool that does not exist, or with arguments the tool rejects (format errors, which never
reach a tool, are counted by the rollout)."""

MAX_MESSAGE_CHARS = 600
"""Longest error message an observation carries (before the observation's own token limit)."""


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

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"ToolResult.outcome must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")

    @property
    def error(self) -> bool:
        return self.outcome != "ok"

    @property
    def infra_fault(self) -> bool:
        return self.outcome in INFRA_FAULTS


def unknown_tool_error(name: str, known_tools: Collection[str] | None) -> str | None:
    """The observation for a call of a tool that does not exist, or None when `name` is known (or unchecked)."""
    if known_tools is None or name in known_tools:
        return None
    return f"Error: unknown tool {clip(name, 80)!r}; available tools: {', '.join(sorted(known_tools)) or 'none'}"


def first_line(exc: BaseException) -> str:
    """An exception as one line for an observation or a status: its first line, else its type name."""
    text = str(exc)
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, with a marker when it was cut."""
    return text if len(text) <= limit else text[: limit - 14] + " ...[cut]"


_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed_text(text: str) -> str:
    """`text` with lone surrogates (from escapes such as JSON's \\ud800) replaced by U+FFFD: tokenizers and
    transports refuse them."""
    return _SURROGATE.sub("\ufffd", text)


_NOISE = re.compile(r"^\s*(For further information visit|Traceback \(most recent call last\))")


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A multi-line message (a validation report, a server's error) as one bounded line: its lines joined with
    '; ', documentation links dropped."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip() and not _NOISE.match(line)]
    return clip("; ".join(lines), limit)
