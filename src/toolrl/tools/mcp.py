"""MCP servers (stdio and streamable HTTP) through the official `mcp` SDK: one session per server, kept open.

Each server connection owns a background thread with its own event loop. A long-lived task there holds the
session (the SDK's anyio contexts must be entered and left in one task) and reconnects after the server
dies. Calls arrive from any event loop, such as a rollout's, and are handed to that thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

from toolrl.loop_thread import LoopThread
from toolrl.tools.call import first_line
from toolrl.tools.function import Tool
from toolrl.tools.limits import TransientToolError

log = logging.getLogger(__name__)


def result_text(result: Any) -> str:
    """A CallToolResult as observation text: structured content as JSON, text parts joined, placeholders for
    non-text parts."""
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        if isinstance(structured, dict) and list(structured) == ["result"]:
            # The SDK wraps a plain return value as {"result": value}; the model sees the value.
            value = structured["result"]
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return json.dumps(structured, ensure_ascii=False)
    parts = []
    for item in result.content:
        if item.type == "text":
            parts.append(item.text)
        else:
            mime = getattr(item, "mime_type", None) or getattr(getattr(item, "resource", None), "mime_type", None)
            parts.append(f"[{item.type} content{f' ({mime})' if mime else ''} not shown]")
    return "\n".join(parts)


class MCPServerConnection:
    """One MCP server; `tools()` lists its tools as `Tool`s named `server.tool`. Subclasses open a transport."""

    def __init__(self, name: str, connect_timeout_s: float = 30.0):
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self.connections = 0
        self._session = None
        self._ready: asyncio.Event | None = None
        self._dead: asyncio.Event | None = None
        self._stopping = False
        self._loop = LoopThread(f"mcp-{name}")
        self._owner = self._loop.submit(self._serve())

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        """Enter the transport's context on `stack`; return its (read, write) streams."""
        raise NotImplementedError

    async def _serve(self) -> None:
        from mcp import ClientSession

        self._ready, self._dead = asyncio.Event(), asyncio.Event()
        failed_starts = 0
        while not self._stopping:
            try:
                async with AsyncExitStack() as stack:
                    read, write = await self._open(stack)
                    session = await stack.enter_async_context(ClientSession(read, write))
                    await session.initialize()
                    self._session = session
                    self.connections += 1
                    failed_starts = 0
                    self._ready.set()
                    await self._dead.wait()
            except Exception as exc:  # the server could not start or died; try again unless closing
                log.warning("MCP server %s: %s", self.name, exc)
                failed_starts += 1
                await asyncio.sleep(min(0.2 * 2 ** (failed_starts - 1), 5.0))  # back off a server that won't start
            finally:
                self._session = None
                self._ready.clear()
                self._dead.clear()

    async def _with_session(self, method: str, *args: Any) -> Any:
        """Run a session method on the owner's loop; after a failure, reconnect once and try again."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout_s
        failures = 0
        while True:
            session = self._session
            if session is None or not self._ready.is_set():  # (re)connecting
                if loop.time() > deadline:
                    raise TransientToolError(f"MCP server {self.name} is not up after {self.connect_timeout_s:g} s")
                await asyncio.sleep(0.01)
                continue
            try:
                return await getattr(session, method)(*args)
            except Exception as exc:
                failures += 1
                reason = first_line(exc)
                if failures == 2:
                    raise TransientToolError(f"MCP server {self.name} failed: {reason}") from exc
                log.warning("MCP server %s: %s; reconnecting", self.name, reason)
                if self._session is session:  # not already replaced by another caller's reconnect
                    self._session = None
                    self._ready.clear()
                    self._dead.set()
                deadline = loop.time() + self.connect_timeout_s

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        result = await self._loop.run(self._with_session("call_tool", tool, arguments))
        text = result_text(result)
        if result.is_error:
            # The Python SDK's servers prefix every message; the observation already names the tool.
            raise RuntimeError(text.removeprefix(f"Error executing tool {tool}: ") or f"{tool} reported an error")
        return text

    def tools(self) -> list[Tool]:
        listed = self._loop.submit(self._with_session("list_tools")).result(self.connect_timeout_s + 5)
        return [self._as_tool(t) for t in listed.tools]

    def _as_tool(self, spec: Any) -> Tool:
        async def call(**arguments: Any) -> str:
            return await self.call(spec.name, arguments)

        schema = dict(spec.input_schema or {"type": "object", "properties": {}})
        return Tool(f"{self.name}.{spec.name}", spec.description or spec.name, schema, call)

    def close(self) -> None:
        if self._stopping:
            return
        self._stopping = True

        async def stop() -> None:
            self._dead.set()

        try:
            self._loop.submit(stop()).result(5)
            self._owner.result(10)
        except Exception as exc:
            log.warning("MCP server %s did not close cleanly: %s", self.name, exc)
        self._loop.stop()


class MCPStdioServer(MCPServerConnection):
    """A server started as a subprocess and spoken to over stdin/stdout."""

    def __init__(
        self,
        name: str,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        connect_timeout_s: float = 30.0,
    ):
        from mcp import StdioServerParameters

        self.params = StdioServerParameters(command=command, args=list(args), env=dict(env) if env else None, cwd=cwd)
        super().__init__(name, connect_timeout_s)

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        from mcp.client.stdio import stdio_client

        return await stack.enter_async_context(stdio_client(self.params))


class MCPHttpServer(MCPServerConnection):
    """A server at a streamable-HTTP `url`, with optional `headers` (for example an authorization token)."""

    def __init__(self, name: str, url: str, headers: Mapping[str, str] | None = None, connect_timeout_s: float = 30.0):
        self.url, self.headers = url, dict(headers or {})
        super().__init__(name, connect_timeout_s)

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        client = await stack.enter_async_context(create_mcp_http_client(headers=self.headers))
        # No cap on one event's size: a tool may return megabytes, which the observation limit then trims.
        return await stack.enter_async_context(
            streamable_http_client(self.url, http_client=client, max_sse_event_size=None)
        )


class MCPSseServer(MCPHttpServer):
    """A server on the legacy HTTP+SSE transport (a GET event stream at `url`, often ending in /sse)."""

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        from mcp.client.sse import sse_client

        return await stack.enter_async_context(
            sse_client(self.url, headers=self.headers, timeout=self.connect_timeout_s)
        )
