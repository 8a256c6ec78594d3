"""The UI's tools tab: a tool config file loaded the way a run loads `tools.file` (`run_executor`: the same
executor, policies, timeouts and limits as training), its servers' status, its tools with their schemas, and
calls made by hand. Arguments are JSON data checked against the tool's schema by the executor; nothing taken
from the page is run as code. A file that is not a tool config is refused without a word of what it holds
(the error a terminal would show quotes the file: `toolrl tools list PATH` shows it there)."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from typing import Any

from toolrl.config.schema import ToolsConfig
from toolrl.errors import ConfigError, ToolError
from toolrl.text import clip
from toolrl.tools import ToolCall
from toolrl.tools.toolset import run_executor

TOOL_FILE_SUFFIXES = (".json", ".yaml", ".yml")
MAX_TOOL_FILE_BYTES = 1_000_000
_QUOTED = re.compile(r"""'[^']*'|"[^"]*"|, got .*?(?=;|$)""")


class ToolBench:
    """One loaded tool config at a time (loading another closes the first)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.path: Path | None = None
        self.executor = None
        self.toolset = None
        self._lock = threading.Lock()

    def load(self, path: str, timeout_s: float = 10.0) -> dict[str, Any]:
        file = Path(path).expanduser()
        shown = clip(path, 200)
        if not file.is_file():
            raise ConfigError(f"{shown}: no such tool config file; give the path of an mcpServers JSON or YAML file")
        if file.suffix.lower() not in TOOL_FILE_SUFFIXES:
            raise ConfigError(f"{shown}: not a tool config file; give an mcpServers file ending in .json or .yaml")
        if file.stat().st_size > MAX_TOOL_FILE_BYTES:
            raise ConfigError(f"{shown}: too large for a tool config file (over 1 MB)")
        with self._lock:
            self.close()
            config = ToolsConfig(file=str(file), timeout_s=timeout_s)
            try:
                self.executor, self.toolset = run_executor([], config, self.log_dir)
            except ConfigError as exc:
                raise ConfigError(without_contents(str(exc), shown)) from None
            self.path = file
        return self.describe()

    def describe(self) -> dict[str, Any]:
        if self.executor is None:
            return {"file": None, "servers": {}, "tools": []}
        tools = [
            {
                "name": tool.name,
                "server": tool.name.split(".", 1)[0],
                "description": tool.description,
                "parameters": tool.parameters,
                "timeout_s": self.executor.policy(tool.name).timeout_s,
            }
            for tool in self.executor.tools.values()
        ]
        servers = dict(self.toolset.status) if self.toolset else {}
        return {"file": str(self.path), "servers": servers, "tools": tools}

    def call(self, name: str, arguments: Any) -> dict[str, Any]:
        if self.executor is None:
            raise ToolError("no tool config loaded: load a tool config file first")
        if not isinstance(arguments, dict):
            raise ToolError('arguments must be a JSON object, like {"a": 1}')
        full = self.toolset.resolve(name) if self.toolset else name
        result = asyncio.run(self.executor.invoke(ToolCall(full, arguments)))
        return {
            "name": full,
            "arguments": arguments,
            "outcome": result.outcome,
            "latency_s": round(result.latency_s, 4),
            "result": result.content,
            "images": [f"data:{image.mime};base64,{image.b64()}" for image in result.images],
        }

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
        if self.toolset is not None:
            self.toolset.close()
        self.executor = self.toolset = self.path = None


def without_contents(message: str, path: str) -> str:
    """A tool config error without what it quoted of the file (keys, values), for a page: what kind of
    problem, and where to see the whole message."""
    body = message.split(": ", 1)[1] if ": " in message else message
    body = clip(_QUOTED.sub("[...]", body), 200)
    return f"{path}: not a valid tool config file ({body}); `toolrl tools list {path}` shows the full error"


def find_tool_files(roots: list[Path]) -> list[str]:
    """Tool config files (an mcpServers key) in `roots` and one level below: suggestions for the path field."""
    found = []
    for root in roots:
        for pattern in ("*", "*/*"):
            for path in root.glob(pattern):
                if path.suffix in TOOL_FILE_SUFFIXES and path.is_file() and path.stat().st_size < 1_000_000:
                    try:
                        if "mcpServers" in path.read_text(errors="ignore"):
                            found.append(str(path))
                    except OSError:
                        continue
    return sorted(set(found))
