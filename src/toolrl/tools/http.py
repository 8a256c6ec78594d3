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
import jsonschema

from toolrl.errors import ConfigError
from toolrl.tools.function import Tool
from toolrl.tools.limits import TransientToolError

RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
"""HTTP statuses worth retrying; any other error status is the final answer."""


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
    JSON when the server sends JSON, else text. Connection failures and 5xx/429 raise TransientToolError."""
    try:
        if method in {"GET", "DELETE"}:
            params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()}
            response = client.request(method, url, params=params)
        else:
            response = client.request(method, url, json=dict(arguments))
    except httpx.TransportError as exc:
        raise TransientToolError(f"{method} {url}: {type(exc).__name__} {exc}".strip()) from exc
    if response.status_code >= 400:
        body = " ".join(response.text.split())[:200]
        message = f"{method} {url} answered HTTP {response.status_code}{': ' + body if body else ''}"
        raise (TransientToolError if response.status_code in RETRY_STATUS else RuntimeError)(message)
    if "json" in response.headers.get("content-type", ""):
        try:
            return response.json()
        except ValueError:
            pass
    return response.text


def schema_checker(schema: Mapping[str, Any], where: str):
    """A function that raises ValueError (a final, non-retried failure) for arguments off `schema`."""
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"{where}: not a valid JSON schema ({exc.message})") from None
    validator = validator_class(schema)

    def check(arguments: Mapping[str, Any]) -> None:
        error = jsonschema.exceptions.best_match(validator.iter_errors(dict(arguments)))
        if error is not None:
            path = ".".join(str(p) for p in error.absolute_path)
            raise ValueError(f"invalid argument{' ' + path if path else 's'}: {error.message}")

    return check


def http_tool(
    name: str,
    client: httpx.Client,
    url: str,
    method: str = "POST",
    description: str = "",
    parameters: Mapping[str, Any] | None = None,
) -> Tool:
    """A tool that sends its arguments to `url` and answers with the reply (JSON re-serialised, or text)."""
    schema = dict(parameters or {"type": "object", "properties": {}})
    check = schema_checker(schema, name)

    def call(**arguments: Any) -> Any:
        check(arguments)
        return request_json(client, method, url, arguments)

    return Tool(name, description or f"{method} {url}", schema, call)
