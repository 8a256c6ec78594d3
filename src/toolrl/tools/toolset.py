"""A tool config file in the MCP `mcpServers` style, and the set of tools it declares.

```yaml
mcpServers:
  files: {command: npx, args: [-y, some-mcp-server], env: {}, cwd: null, deny: [delete_file]}
  web: {url: "http://127.0.0.1:8000/mcp", headers: {Authorization: "Bearer ..."}, connect_timeout_s: 10}
  calc: {python: "toolrl.envs.calculator.tool:calculator"}
```
Tools are named `server.tool`; a short name resolves when only one server has it. `allow` and `deny` filter a
server's tools by their short names. `python` names a function, or a class whose public methods are tools
(constructed without arguments); nothing is executed from the config text beyond that import.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolrl.config.loader import format_validation_error
from toolrl.errors import ConfigError, ToolError
from toolrl.tools.call import first_line
from toolrl.tools.function import Tool, tool_from_function


class ServerEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    python: str | None = None
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    connect_timeout_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def one_kind(self) -> ServerEntry:
        kinds = [k for k in ("command", "url", "python") if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError("needs exactly one of command (stdio MCP), url (HTTP MCP) or python (module:name)")
        return self

    def keeps(self, short: str) -> bool:
        return (self.allow is None or short in self.allow) and short not in self.deny


class ToolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mcp_servers: dict[str, ServerEntry] = Field(alias="mcpServers")


def _python_tools(name: str, target: str) -> list[Tool]:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"mcpServers.{name}.python: {target!r} must look like package.module:function")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"mcpServers.{name}.python: cannot import {target!r} ({exc})") from None
    if inspect.isclass(obj):
        instance = obj()
        methods = [m for n, m in inspect.getmembers(instance, inspect.ismethod) if not n.startswith("_")]
        return [tool_from_function(m) for m in methods]
    if callable(obj):
        return [tool_from_function(obj)]
    raise ConfigError(f"mcpServers.{name}.python: {target!r} is neither a function nor a class")


class Toolset:
    """The tools of a config file, with their servers; `close()` ends the MCP sessions."""

    def __init__(self, servers: dict[str, Any], tools: list[Tool], status: dict[str, str]):
        self.servers, self.tools, self.status = servers, tools, status

    @classmethod
    def load(cls, path: str | Path) -> Toolset:
        from toolrl.tools.mcp import MCPHttpServer, MCPStdioServer

        entries = _read(Path(path))
        servers: dict[str, Any] = {}
        tools: list[Tool] = []
        status: dict[str, str] = {}
        for name, entry in entries.mcp_servers.items():
            try:
                if entry.python:
                    found = _python_tools(name, entry.python)
                    found = [
                        Tool(f"{name}.{t.name}", t.description, t.parameters, t.fn, t.arguments_model) for t in found
                    ]
                else:
                    server = (
                        MCPStdioServer(name, entry.command, entry.args, entry.env, entry.cwd, entry.connect_timeout_s)
                        if entry.command
                        else MCPHttpServer(name, entry.url, entry.headers, entry.connect_timeout_s)
                    )
                    servers[name] = server
                    found = server.tools()
                status[name] = "ok"
            except ConfigError:
                raise
            except Exception as exc:  # a server that is down: its tools are missing, the others still load
                status[name] = f"error: {first_line(exc)}"
                continue
            tools += [t for t in found if entry.keeps(t.name.split(".", 1)[1])]
        return cls(servers, tools, status)

    def resolve(self, name: str) -> str:
        """The full `server.tool` name for a full or unambiguous short name."""
        names = [t.name for t in self.tools]
        if name in names:
            return name
        matches = [n for n in names if n.split(".", 1)[1] == name]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise ToolError(f"tool name {name!r} is ambiguous: {', '.join(matches)}; use server.tool")
        raise ToolError(f"no tool {name!r}; tools: {', '.join(names) or 'none'}")

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


def _read(path: Path) -> ToolsFile:
    if not path.is_file():
        raise ConfigError(f"tool config {path} does not exist")
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({exc})") from None
    try:
        return ToolsFile.model_validate(data or {})
    except ValidationError as exc:
        errors = exc.errors()
        error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # a typo explains the rest
        key = ".".join(str(p) for p in error["loc"])
        if error["type"] == "value_error":
            raise ConfigError(f"{path}: {key} {error['msg'].removeprefix('Value error, ')}") from None
        if error["type"] == "extra_forbidden":
            known = ", ".join(ServerEntry.model_fields) if len(error["loc"]) == 3 else "mcpServers"
            raise ConfigError(f"{path}: unknown key '{key}'; known keys here: {known}") from None
        raise ConfigError(format_validation_error(exc, str(path))) from None
