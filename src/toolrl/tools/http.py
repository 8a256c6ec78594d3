"""Plain HTTP JSON endpoints as tools, with a JSON schema declared in the tool config.

Calls go through one `httpx.Client` per server, used from the executor's worker threads: a sync client is
thread-safe and independent of any event loop, so the connection pool lives for the whole run even though
each rollout may run on a loop of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import httpx

from toolrl.errors import ConfigError
from toolrl.tools.function import Tool, json_schema_checker
from toolrl.tools.limits import ServerUnavailable, TransientToolError

NOT_PROCESSED_STATUS = {408, 425, 429, 503}
"""Statuses that say the server did not act on the request: retried whatever the tool."""
RETRY_STATUS = NOT_PROCESSED_STATUS | {500, 502, 504}
"""HTTP statuses worth retrying (those outside NOT_PROCESSED_STATUS only for tools safe to repeat); any other
error status is the final answer."""
IDEMPOTENT_METHODS = {"GET", "PUT", "DELETE"}


def bearer_header(api_key_env: str | None, where: str) -> dict[str, str]:
    """An Authorization header with the key held in the environment variable `api_key_env` (none if unset);
    a variable that is named but empty is a ConfigError at `where`. Keys never live in config files."""
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise ConfigError(f"{where}: environment variable {api_key_env} is not set")
    return {"Authorization": f"Bearer {key}"}


def http_client(headers: Mapping[str, str] | None, connect_timeout_s: float, read_timeout_s: float) -> httpx.Client:
    timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
    return httpx.Client(headers=dict(headers or {}), timeout=timeout, follow_redirects=True)


def request_json(client: httpx.Client, method: str, url: str, arguments: Mapping[str, Any]) -> Any:
    """Send `arguments` (query string for GET/DELETE, JSON body otherwise) and return the decoded reply:
    JSON when the server sends JSON, else text. A request that never reached the server (connection refused,
    429, 503) raises ServerUnavailable; other connection failures and 5xx raise TransientToolError."""
    try:
        if method in {"GET", "DELETE"}:
            params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()}
            response = client.request(method, url, params=params)
        else:
            response = client.request(method, url, json=dict(arguments))
    except httpx.TransportError as exc:
        failure = (
            ServerUnavailable if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) else TransientToolError
        )
        raise failure(f"{method} {url}: {type(exc).__name__} {exc}".strip()) from exc
    if response.status_code >= 400:
        body = " ".join(response.text.split())[:200]
        message = f"{method} {url} answered HTTP {response.status_code}{': ' + body if body else ''}"
        status = response.status_code
        failure = (
            ServerUnavailable
            if status in NOT_PROCESSED_STATUS
            else TransientToolError
            if status in RETRY_STATUS
            else RuntimeError
        )
        raise failure(message)
    if "json" in response.headers.get("content-type", ""):
        try:
            return response.json()
        except ValueError:
            pass
    return response.text


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
        return request_json(client, method, url, arguments)

    return Tool(
        name,
        description or f"{method} {url}",
        schema,
        call,
        check=check,
        idempotent=method in IDEMPOTENT_METHODS,
        isolation="thread",  # bounded by the client's timeouts; the client lives in this process
    )
