"""Run tool calls on asyncio: the calls of a turn run concurrently; every failure becomes a short observation."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from toolrl.tools.call import ToolCall, ToolResult
from toolrl.tools.function import Tool


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class ToolExecutor:
    """Owns a set of tools by name; `metrics` counts calls and failures by kind."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float = 10.0):
        self.tools = {tool.name: tool for tool in tools}
        self.timeout_s = timeout_s
        self.metrics: Counter[str] = Counter()

    async def invoke(self, call: ToolCall) -> ToolResult:
        self.metrics["calls"] += 1
        tool = self.tools.get(call.name)
        if tool is None:
            self.metrics["errors_unknown_tool"] += 1
            known = ", ".join(self.tools) or "none"
            return ToolResult(call, f"Error: unknown tool {call.name!r}; available tools: {known}", error=True)
        try:
            value = await asyncio.wait_for(tool(call.arguments), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            self.metrics["errors_timeout"] += 1
            return ToolResult(call, f"Error: {call.name} timed out after {self.timeout_s:g} s", error=True)
        except ValueError as exc:
            self.metrics["errors_arguments"] += 1
            return ToolResult(call, f"Error: {exc}", error=True)
        except Exception as exc:  # a tool's own failure must never end the rollout
            self.metrics["errors_raised"] += 1
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return ToolResult(call, f"Error: {call.name} failed: {message}", error=True)
        return ToolResult(call, _to_text(value))

    async def invoke_all(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        return list(await asyncio.gather(*(self.invoke(call) for call in calls)))
