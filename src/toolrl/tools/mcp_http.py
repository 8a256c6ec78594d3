"""MCP servers over HTTP: streamable HTTP and the legacy HTTP+SSE transport, through the SDK's clients. The
session handling shared with stdio is in mcp.py."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

from toolrl.tools.mcp import MCPServerConnection


class MCPHttpServer(MCPServerConnection):
    """A server at a streamable-HTTP `url`, with optional `headers` (for example an authorization token)."""

    def __init__(self, name: str, url: str, headers: Mapping[str, str] | None = None, connect_timeout_s: float = 30.0):
        self.url, self.headers = url, dict(headers or {})
        super().__init__(name, connect_timeout_s)

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any, Any | None]:
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        client = await stack.enter_async_context(create_mcp_http_client(headers=self.headers))
        # No cap on one event's size: a tool may return megabytes, which the observation limit then trims.
        read, write = await stack.enter_async_context(
            streamable_http_client(self.url, http_client=client, max_sse_event_size=None)
        )
        return read, write, None, None


class MCPSseServer(MCPHttpServer):
    """A server on the legacy HTTP+SSE transport (a GET event stream at `url`, often ending in /sse)."""

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any, Any | None]:
        from mcp.client.sse import sse_client

        read, write = await stack.enter_async_context(
            sse_client(self.url, headers=self.headers, timeout=self.connect_timeout_s)
        )
        return read, write, None, None
