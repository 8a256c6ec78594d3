"""A tool config file in the MCP `mcpServers` style, and the set of tools it declares.

```yaml
mcpServers:
  time: {command: mcp-server-time, args: [--local-timezone, UTC]}          # MCP over stdio
  web: {url: "http://127.0.0.1:8000/mcp", headers: {Authorization: "Bearer ..."}}   # streamable HTTP
  old: {url: "http://127.0.0.1:8001/sse", transport: sse}                   # legacy HTTP+SSE
  calc: {python: "toolrl.envs.calculator.tool:calculator"}                  # a function, or a class
  weather:                                                                  # plain HTTP JSON endpoints
    http:
      forecast:
        url: "http://127.0.0.1:9000/forecast"
        method: GET
        description: Weather forecast for a city.
        parameters: {type: object, properties: {city: {type: string}}, required: [city]}
  helper: {model: {base_url: "http://127.0.0.1:8080/v1", model: qwen3-8b, system: "Answer briefly."}}
  local: {model: {path: smollm2-135m-instruct, max_tokens: 64}}            # a local HF model as a tool
  research: {agent: "my_package.workflows:research"}                       # a workflow of the other tools
  search:
    command: python
    args: [-m, my_search_server]
    policy: {timeout_s: 30, retries: 3}                                     # for every tool of the server
    policies: {lookup: {cache: true, rate_per_s: 20}}                       # for one tool, by short name
```
Tools are named `server.tool`; a short name resolves when only one server has it. `allow` and `deny` filter a
server's tools by their short names. `python` and `agent` name an importable function (or for `python`, a
class whose public methods are tools, constructed without arguments); nothing is executed from the config
text beyond that import. Each kind of entry is built by a function registered in `ENTRY_KINDS`.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from toolrl.errors import ConfigError, ToolError
from toolrl.files import load_structured
from toolrl.plugins import import_object
from toolrl.registry import Registry
from toolrl.text import clip, closest, did_you_mean, first_line
from toolrl.tools.function import Tool, tool_from_function
from toolrl.tools.limits import ToolPolicy
from toolrl.tools.model import ModelBackend
from toolrl.validation import BoundedModel, format_validation_error, nearest_keys

if TYPE_CHECKING:
    from toolrl.tools.executor import ToolExecutor


class Entry(BoundedModel, BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PolicyEntry(Entry):
    """Overrides of the executor's default `ToolPolicy`; keys left out keep the default."""

    timeout_s: float | None = Field(None, gt=0)
    """The call's deadline, retries and reconnects included."""
    retries: int | None = Field(None, ge=0)
    backoff_s: float | None = Field(None, ge=0)
    retry: bool | None = None
    """Safe to repeat after a failure that may have reached the tool; unset: MCP's readOnlyHint/idempotentHint,
    the HTTP method (GET, PUT, DELETE), false for Python functions."""
    isolation: Literal["process", "thread", "loop", "inline"] | None = None
    """Where a synchronous Python tool runs: process (killed at its deadline; the default for importable
    functions) or thread (for tools known to return)."""
    max_concurrency: int | None = Field(None, ge=1)
    rate_per_s: float | None = Field(None, gt=0)
    cache: bool | None = None

    def apply(self, policy: ToolPolicy) -> ToolPolicy:
        return dataclasses.replace(policy, **self.model_dump(exclude_unset=True))


class HttpEndpoint(Entry):
    url: str
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    """GET and DELETE send the arguments as the query string, the others as a JSON body."""
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON schema of the arguments; calls off the schema are answered with an error, not sent."""


class ModelEntry(ModelBackend):
    """A model tool: the model to ask (ModelBackend's keys) and the tool's name and description."""

    name: str = "ask"
    """The tool's short name."""
    description: str | None = None


class ServerEntry(Entry):
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    transport: Literal["streamable-http", "sse"] | None = None
    """For `url`: streamable-http, or sse for the legacy transport; by default sse when the URL ends in /sse."""
    headers: dict[str, str] = Field(default_factory=dict)
    python: str | None = None
    http: dict[str, HttpEndpoint] | None = None
    model: ModelEntry | None = None
    agent: str | None = None
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    connect_timeout_s: float = Field(30.0, gt=0)
    spare: bool | int = Field(False, ge=0, le=8)
    """For `command`: keep servers started and idle besides the live one (true: one; a number: that many),
    one promoted at once when the live one crashes, so that the calls behind a crash do not wait for a restart
    (a process each; two also cover a second crash while the first one's replacement starts)."""
    processes: int = Field(2, ge=1, le=16)
    """For `command`: server processes that share the calls (mcp_pool.py): a call that hangs, spins or crashes
    one of them holds up only the calls in that one, and a safe-to-repeat call goes to another after
    hedge_after_s. 1 for a server that keeps state between calls."""
    hedge_after_s: float | None = Field(1.0, gt=0)
    """For `command` with processes > 1: a safe-to-repeat call without an answer this long is also sent to
    another process, the first answer taken (null: never)."""
    policy: PolicyEntry | None = None
    policies: dict[str, PolicyEntry] = Field(default_factory=dict)

    def retry_of(self, short: str) -> bool | None:
        """The `retry` the config gives tool `short` (its own policy, else the server's); None where it is unset."""
        own = self.policies.get(short)
        if own is not None and own.retry is not None:
            return own.retry
        return self.policy.retry if self.policy is not None else None

    @model_validator(mode="after")
    def one_kind(self) -> ServerEntry:
        kinds = [k for k in ENTRY_KINDS if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError(f"needs exactly one of {', '.join(ENTRY_KINDS)}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ENTRY_KINDS if getattr(self, k))

    def keeps(self, short: str) -> bool:
        return (self.allow is None or short in self.allow) and short not in self.deny


SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ToolsFile(Entry):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    mcp_servers: dict[str, ServerEntry] = Field(alias="mcpServers")

    @field_validator("mcp_servers")
    @classmethod
    def _server_names(cls, servers: dict[str, ServerEntry]) -> dict[str, ServerEntry]:
        for name in servers:
            if not SERVER_NAME.fullmatch(name):
                raise ValueError(
                    f"{clip(name, 60)!r} is not a server name: use letters, digits, _ and - (at most 64; no dot, "
                    "which separates a server from its tools in server.tool)"
                )
        return servers


Builder = Callable[[str, ServerEntry, "Toolset"], list[Tool]]
ENTRY_KINDS: Registry[Builder] = Registry("entry kind", "mcpServers")
"""Entry kind (the key that selects it) -> function building that server's tools, named `server.tool`."""
entry_kind = ENTRY_KINDS.register


def _renamed(server: str, tools: list[Tool]) -> list[Tool]:
    return [dataclasses.replace(t, name=f"{server}.{t.name}") for t in tools]


@entry_kind("command")
def _stdio(name: str, entry: ServerEntry, toolset: Toolset) -> list[Tool]:
    from toolrl.tools.mcp_pool import MCPServerPool
    from toolrl.tools.mcp_stdio import MCPStdioServer

    def member(i: int) -> MCPStdioServer:
        log_path = toolset.log_dir / (f"{name}.log" if i == 0 else f"{name}.{i}.log")
        return MCPStdioServer(name, entry.command, entry.args, entry.env, entry.cwd, entry.connect_timeout_s,
                              log_path, spare=int(entry.spare))  # fmt: skip

    if entry.processes > 1:
        server = MCPServerPool(name, member, entry.processes, entry.hedge_after_s, entry.retry_of)
    else:
        server = member(0)
    toolset.servers[name] = server
    return server.tools()


@entry_kind("url")
def _mcp_http(name: str, entry: ServerEntry, toolset: Toolset) -> list[Tool]:
    from toolrl.tools.mcp_http import MCPHttpServer, MCPSseServer

    sse = entry.transport == "sse" or (entry.transport is None and entry.url.rstrip("/").endswith("/sse"))
    server = (MCPSseServer if sse else MCPHttpServer)(name, entry.url, entry.headers, entry.connect_timeout_s)
    toolset.servers[name] = server
    return server.tools()


@entry_kind("python")
def _python(name: str, entry: ServerEntry, toolset: Toolset) -> list[Tool]:
    where = f"mcpServers.{name}.python"
    obj = import_object(where, entry.python)
    if inspect.isclass(obj):
        instance = obj()
        methods = [m for n, m in inspect.getmembers(instance, inspect.ismethod) if not n.startswith("_")]
        return _renamed(name, [tool_from_function(m) for m in methods])
    if callable(obj):
        return _renamed(name, [tool_from_function(obj)])
    raise ConfigError(f"{where}: {entry.python!r} is neither a function nor a class")


@entry_kind("http")
def _http(name: str, entry: ServerEntry, toolset: Toolset) -> list[Tool]:
    from toolrl.tools.http import http_client, http_tool

    client = http_client(entry.headers, entry.connect_timeout_s, read_timeout_s=300)
    toolset.clients.append(client)
    tools = []
    for short, ep in entry.http.items():
        try:
            tools.append(http_tool(f"{name}.{short}", client, ep.url, ep.method, ep.description, ep.parameters))
        except ValueError as exc:
            raise ConfigError(f"mcpServers.{name}.http.{short}.parameters: {exc}") from None
    return tools


@entry_kind("model")
def _model(name: str, entry: ServerEntry, toolset: Toolset) -> list[Tool]:
    from toolrl.tools.model import chat_backend, model_tool

    spec = entry.model
    ask, client = chat_backend(spec, f"mcpServers.{name}.model", entry.headers, entry.connect_timeout_s)
    if client is not None:
        toolset.clients.append(client)
    default = f"Ask the {'model ' + spec.model if spec.base_url else 'local model ' + spec.path}; it answers in text."
    return [model_tool(f"{name}.{spec.name}", spec.description or default, ask)]


@entry_kind("agent")
def _agent(name: str, entry: ServerEntry, toolset: Toolset) -> list[Tool]:
    from toolrl.tools.agent import agent_tool

    where = f"mcpServers.{name}.agent"
    return _renamed(name, [agent_tool(import_object(where, entry.agent), toolset.toolbox, where)])


def default_log_dir() -> Path:
    """Where the stderr of MCP servers and tool workers goes outside a run: $TOOLRL_HOME/logs/tools."""
    from toolrl.home import toolrl_home

    return toolrl_home() / "logs" / "tools"


class Toolset:
    """The tools of a config file, their servers and policies; `close()` ends sessions and clients. Each stdio
    server's stderr goes to `log_dir/NAME.log` (the run directory's tools/ during training)."""

    def __init__(self, log_dir: str | Path | None = None) -> None:
        from toolrl.tools.agent import ToolBox

        self.log_dir = Path(log_dir) if log_dir else default_log_dir()
        self.servers: dict[str, Any] = {}
        self.clients: list[Any] = []
        self.tools: list[Tool] = []
        self.status: dict[str, str] = {}
        self.entries: dict[str, ServerEntry] = {}
        self.toolbox = ToolBox(self)

    @classmethod
    def load(cls, path: str | Path, log_dir: str | Path | None = None) -> Toolset:
        toolset = cls(log_dir)
        toolset.entries = read_tool_file(Path(path)).mcp_servers
        try:
            for name, entry in toolset.entries.items():
                toolset._add(name, entry)
        except BaseException:
            toolset.close()
            raise
        return toolset

    def _add(self, name: str, entry: ServerEntry) -> None:
        try:
            found = ENTRY_KINDS[entry.kind](name, entry, self)
        except ConfigError:
            raise
        except Exception as exc:  # a server that is down: its tools are missing, the others still load
            reason = str(exc) if isinstance(exc, ToolError) else first_line(exc)
            log = self.log_dir / f"{name}.log"
            self.status[name] = f"error: {reason}" + (f" (log: {log})" if entry.command and log.is_file() else "")
            return
        shorts = {t.name.split(".", 1)[1] for t in found}
        for short in entry.policies:
            if short not in shorts:
                raise ConfigError(
                    f"mcpServers.{name}.policies.{short}: server {name} has no tool {short!r}; "
                    f"its tools: {', '.join(sorted(shorts)) or 'none'}"
                )
        self.status[name] = "ok"
        self.tools += [t for t in found if entry.keeps(t.name.split(".", 1)[1])]

    def policies(self, default: ToolPolicy) -> dict[str, ToolPolicy]:
        """Each tool's policy: `default`, then its server's `policy`, then its own entry in `policies`."""
        result = {}
        for tool in self.tools:
            server, short = tool.name.split(".", 1)
            entry = self.entries[server]
            policy = entry.policy.apply(default) if entry.policy else default
            result[tool.name] = entry.policies[short].apply(policy) if short in entry.policies else policy
        return result

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
        forms = {n.split(".", 1)[1]: n for n in names} | {n: n for n in names}  # a typo of either form
        near = closest(name, forms)
        guess = f" (did you mean {forms[near]!r}?)" if near else ""
        raise ToolError(f"no tool {name!r}{guess}; tools: {', '.join(names) or 'none'}")

    def close(self) -> None:
        """Close every server at once (each is bounded by its shutdown grace periods), then the clients."""
        import threading

        self.toolbox.close()
        closing = [threading.Thread(target=server.close, daemon=True) for server in self.servers.values()]
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join(timeout=5)
        for client in self.clients:
            client.close()


def read_tool_file(path: Path) -> ToolsFile:
    """A tool config file, validated (nothing started, nothing imported)."""
    data = load_structured(path, "tool config")
    try:
        return ToolsFile.model_validate(data or {})
    except ValidationError as exc:
        errors = exc.errors()
        error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # a typo explains the rest
        key = ".".join(str(p) for p in error["loc"])
        if error["type"] == "extra_forbidden":
            known = _known_keys(error["loc"])
            guess, nearest = did_you_mean(error["loc"][-1], known), nearest_keys(error["loc"][-1], known)
            raise ConfigError(f"{path}: unknown key '{clip(key, 120)}'{guess}; {nearest}") from None
        raise ConfigError(format_validation_error(exc, str(path), ToolsFile)) from None


SECTIONS: dict[str, type[Entry]] = {
    "http": HttpEndpoint,
    "model": ModelEntry,
    "policy": PolicyEntry,
    "policies": PolicyEntry,
}
"""Where a server entry nests a model, by key: used to list the known keys next to an unknown one."""


def _known_keys(loc: tuple) -> list[str]:
    """The keys allowed where the unknown key at `loc` was found."""
    if len(loc) < 3:
        return ["mcpServers"]
    model = ServerEntry if len(loc) == 3 else SECTIONS[str(loc[2])]
    return list(model.model_fields)


def run_executor(
    env_tools: list[Tool], config: Any, log_dir: str | Path | None = None
) -> tuple[ToolExecutor, Toolset | None]:
    """The executor of a run: the environment's tools plus those of `config.file` (a `ToolsConfig`), with
    the file's policies over the run's default timeout; servers' and workers' stderr under `log_dir`. Close
    the toolset, when there is one, at the end."""
    from toolrl.tools.executor import ToolExecutor
    from toolrl.tools.images import ImageLimits

    log_dir = Path(log_dir) if log_dir else default_log_dir()
    toolset = Toolset.load(config.file, log_dir) if config.file else None
    tools = list(env_tools) + (toolset.tools if toolset else [])
    default = ToolPolicy(timeout_s=config.timeout_s)
    names = [t.name for t in tools]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        if toolset:
            toolset.close()
        raise ConfigError(f"tools.file: tool {clash[0]!r} clashes with an environment tool; rename its server")
    policies = toolset.policies(default) if toolset else {}
    try:
        executor = ToolExecutor(
            tools,
            config.timeout_s,
            config.max_concurrency,
            policies=policies,
            cache_path=config.cache_file,
            log_dir=log_dir,
            image_limits=ImageLimits(max_pixels=config.image_max_pixels, max_per_result=config.images_per_result),
            import_timeout_s=config.import_timeout_s,
        )
    except ToolError as exc:
        if toolset:
            toolset.close()
        raise ConfigError(f"tools.file: {exc}") from None
    return executor, toolset
