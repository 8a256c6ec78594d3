"""Tools: typed Python functions exposed to the model, and the executor that runs their calls."""

from toolrl.tools.call import ToolCall, ToolResult
from toolrl.tools.executor import ToolExecutor
from toolrl.tools.function import Tool, tool_from_function
from toolrl.tools.limits import InvalidArguments, ToolPolicy, TransientToolError

__all__ = [
    "InvalidArguments",
    "Tool",
    "ToolCall",
    "ToolExecutor",
    "ToolPolicy",
    "ToolResult",
    "TransientToolError",
    "tool_from_function",
]
