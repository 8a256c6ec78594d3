"""The HTTP client toolrl shares (HTTP tools, model tools, simulated users, the judge, the OpenAI engine): one
`httpx.Client` per server with an API key from the environment, JSON requests, and failures told apart by
whether the request may have reached the server. Each caller maps them to its own errors (a tool's retries,
an engine's one-line stop)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

from toolrl.errors import ConfigError


class HTTPFailure(RuntimeError):
    """The server answered with an error status that retrying will not change."""


class HTTPTransient(HTTPFailure):
    """A failure worth retrying (a dropped connection, a 5xx); the request may have reached the server."""


class Unreachable(HTTPTransient):
    """The request never reached the server (connection refused, 429, 503): always safe to send again."""


NOT_PROCESSED_STATUS = {408, 425, 429, 503}
"""Statuses that say the server did not act on the request: retried whatever the tool."""
RETRY_STATUS = NOT_PROCESSED_STATUS | {500, 502, 504}
"""HTTP statuses worth retrying (those outside NOT_PROCESSED_STATUS only for tools safe to repeat); any other
error status is the final answer."""


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
    JSON when the server sends JSON, the bytes of an image (image/*), else text. A request that never reached
    the server (connection refused, 429, 503) raises Unreachable; other connection failures and 5xx raise
    HTTPTransient; other error statuses raise HTTPFailure."""
    try:
        if method in {"GET", "DELETE"}:
            params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()}
            response = client.request(method, url, params=params)
        else:
            response = client.request(method, url, json=dict(arguments))
    except httpx.TransportError as exc:
        failure = Unreachable if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) else HTTPTransient
        raise failure(f"{method} {url}: {type(exc).__name__} {exc}".strip()) from exc
    if response.status_code >= 400:
        body = " ".join(response.text.split())[:200]
        message = f"{method} {url} answered HTTP {response.status_code}{': ' + body if body else ''}"
        status = response.status_code
        failure = HTTPTransient if status in RETRY_STATUS else HTTPFailure
        failure = Unreachable if status in NOT_PROCESSED_STATUS else failure
        raise failure(message)
    kind = response.headers.get("content-type", "")
    if "json" in kind:
        try:
            return response.json()
        except ValueError:
            pass
    if kind.startswith("image/"):
        return response.content  # a tool's image (toolrl.tools.images checks it)
    return response.text


class ThreadServer:
    """A uvicorn server on a thread of its own (the gateway, the box server): `start` returns once it listens, with
    the port it got; `stop` asks it to end and waits for its thread."""

    def __init__(self, config, name: str):
        import uvicorn

        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)
        self.port: int | None = None

    def start(self, timeout: float, what: str) -> int:
        """The port it listens on; RuntimeError naming `what` when it did not start within `timeout` seconds."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self.port

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self.thread.ident is not None:
            self.thread.join(timeout=timeout)
