"""Plain HTTP JSON endpoints as tools, with a JSON schema declared in the tool config.

Calls go through one `httpx.Client` per server, used from the executor's worker threads: a sync client is
thread-safe and independent of any event loop, so the connection pool lives for the whole run even though
each rollout may run on a loop of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from toolrl.http import HTTPTransient, Unreachable, bearer_header, http_client, request_json
from toolrl.tools.function import Tool, json_schema_checker
from toolrl.tools.limits import ServerUnavailable, TransientToolError

__all__ = ["bearer_header", "http_client", "http_tool", "request_json", "tool_request"]

IDEMPOTENT_METHODS = {"GET", "PUT", "DELETE"}


def tool_request(client: httpx.Client, method: str, url: str, arguments: Mapping[str, Any]) -> Any:
    """request_json with a tool's errors: ServerUnavailable (never reached: always retried) and
    TransientToolError (retried when the tool is safe to repeat)."""
    try:
        return request_json(client, method, url, arguments)
    except Unreachable as exc:
        raise ServerUnavailable(str(exc)) from exc
    except HTTPTransient as exc:
        raise TransientToolError(str(exc)) from exc


def http_tool(
    name: str,
    client: httpx.Client,
    url: str,
    method: str = "POST",
    description: str = "",
    parameters: Mapping[str, Any] | None = None,
) -> Tool:
    """A tool that sends its arguments to `url` and answers with the reply (JSON re-serialised, or text). GET,
    PUT and DELETE are safe to repeat by HTTP's own rules; POST is not unless the policy says `retry: true`."""
    schema = dict(parameters or {"type": "object", "properties": {}})
    check = json_schema_checker(schema, name)

    def call(**arguments: Any) -> Any:
        return tool_request(client, method, url, arguments)

    return Tool(
        name,
        description or f"{method} {url}",
        schema,
        call,
        check=check,
        idempotent=method in IDEMPOTENT_METHODS,
        isolation="thread",  # bounded by the client's timeouts; the client lives in this process
        runs_elsewhere=True,
    )
