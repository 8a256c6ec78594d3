"""Agent tools: a workflow written in Python that calls other tools of the same tool config.

```python
from toolrl.tools.agent import ToolBox

async def research(question: str, tools: ToolBox) -> str:
    \"\"\"Search, then summarise the top hit with the helper model.\"\"\"
    hits = await tools.call("search", query=question)
    return await tools.call("helper.ask", prompt=f"Summarise for {question!r}: {hits}")
```
The parameter typed `ToolBox` is filled in by toolrl and hidden from the model; the others form the schema.
Inner calls go through an executor with the config's policies (timeouts, retries, cache). The agent tool's
own timeout, set in its policy, bounds the whole workflow.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, get_type_hints

from toolrl.errors import ConfigError
from toolrl.tools.call import ToolCall
from toolrl.tools.function import Tool, tool_from_function
from toolrl.tools.limits import ToolFailed, ToolPolicy

if TYPE_CHECKING:
    from toolrl.tools.executor import ToolExecutor


class ToolSource(Protocol):
    """What a ToolBox calls through: a tool config file's tools (toolset.py's Toolset)."""

    tools: list[Tool]
    log_dir: Path

    def policies(self, default: ToolPolicy) -> dict[str, ToolPolicy]: ...

    def resolve(self, name: str) -> str: ...


class ToolBox:
    """The tools an agent workflow may call, by full `server.tool` or unambiguous short name."""

    def __init__(self, toolset: ToolSource):
        self.toolset = toolset
        self._executor: ToolExecutor | None = None

    @property
    def executor(self) -> ToolExecutor:
        if self._executor is None:
            from toolrl.tools.executor import ToolExecutor

            policies = self.toolset.policies(ToolPolicy())
            self._executor = ToolExecutor(self.toolset.tools, policies=policies, log_dir=self.toolset.log_dir)
        return self._executor

    async def call(self, name: str, /, **arguments: Any) -> str:
        """The tool's observation text; a failed call raises ToolFailed with its message (the workflow's own
        observation then tells it as it is)."""
        result = await self.executor.invoke(ToolCall(self.toolset.resolve(name), arguments))
        if result.error:
            raise ToolFailed(result.content.removeprefix("Error: "))
        return result.content

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()


def agent_tool(fn: Callable[..., Any], box: ToolBox, where: str) -> Tool:
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{where}: an agent workflow must be an async function (async def)")
    slots = [name for name, hint in get_type_hints(fn).items() if hint is ToolBox]
    if len(slots) != 1:
        raise ConfigError(f"{where}: an agent workflow takes exactly one parameter typed ToolBox")
    return tool_from_function(fn, inject={slots[0]: box})
