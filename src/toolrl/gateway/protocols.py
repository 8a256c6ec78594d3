"""The wire protocols the gateway speaks, by name: each a thin adapter that turns a request body into a
`TurnRequest` and turns back the sampled `Turn`s (or their events) into its own reply, stream and error shapes.
The gateway core (server.py) knows none of them; routes.py serves each at its path, plain and per sample."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from toolrl.gateway.capture import Sample
from toolrl.gateway.turns import Event, GatewayError, Turn, TurnRequest
from toolrl.registry import Registry

Gateway = Any
"""The gateway core (server.Gateway), which serves the protocols: named here, not imported (it imports them)."""
TurnWork = Any
"""A request made ready to sample (server.TurnWork)."""


class Protocol(ABC):
    """One wire protocol: served at `path` under /v1 (and /s/SAMPLE/v1 for one agent run)."""

    name: str
    path: str
    without_v1: bool = False
    """Served at `path` without /v1 too: clients that add only the path to a base URL given without /v1 (the
    Anthropic convention, which the Vercel AI SDK's provider does not follow)."""

    @abstractmethod
    def parse(self, body: Any, gateway: Gateway, sample: Sample | None) -> TurnRequest:
        """A request body (JSON) as a TurnRequest; refusals raise GatewayError (or pydantic's ValidationError)."""

    @abstractmethod
    def reply(self, gateway: Gateway, work: TurnWork, turns: list[Turn]) -> dict[str, Any]:
        """The sampled turns as its reply body."""

    @abstractmethod
    def stream(self, gateway: Gateway, work: TurnWork, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        """Server-sent events from the turn's events (an error after the first event is the stream's last)."""

    @abstractmethod
    def error(self, error: GatewayError) -> dict[str, Any]:
        """A refusal as its error body."""

    def endpoints(self) -> list[tuple[str, str, Any]]:
        """Its other endpoints: (method, path under /v1, async handler(gateway, body, sample, path_params) ->
        reply body)."""
        return []


PROTOCOLS: Registry[Protocol] = Registry("wire protocol", "gateway")
for _name, _module in [("chat", "toolrl.gateway.chat"), ("responses", "toolrl.gateway.responses"),
                       ("messages", "toolrl.gateway.messages")]:  # fmt: skip
    PROTOCOLS.declare(_name, _module)


def register_protocol(protocol: Protocol, replace: bool = False) -> Protocol:
    """Serve `protocol` (an instance of a Protocol subclass) at its path (every gateway started afterwards)."""
    PROTOCOLS.register(protocol.name, replace=replace)(protocol)
    return protocol


def validation_error(exc: ValidationError) -> GatewayError:
    """pydantic's first complaint as one line naming the field."""
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"]) or "(body)"
    return GatewayError(f"{where}: {error['msg']}", param=where)


def unsupported(extra: dict[str, Any] | None, ignored: tuple[str, ...]) -> None:
    """Refuse, naming it, the first field a request holds beyond those its model reads (`extra`) that is not
    harmless to ignore."""
    for name in sorted(extra or {}):
        if name not in ignored:
            raise GatewayError(f"{name}: not supported by this gateway", param=name)


def parts_text(parts: Any, where: str, readable: dict[str, str]) -> str:
    """A content's text: a string, or a list of parts whose types `readable` maps to the key holding their text
    (joined); any other part (an image, a file) is refused in one line naming it."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise GatewayError(f"{where}: must be text or a list of text parts", param=where)
    out = []
    for k, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in readable:
            raise GatewayError(f"{where}[{k}].type: {str(kind)[:40]} is not supported here (text only)",
                               param=f"{where}[{k}]")  # fmt: skip
        out.append(str(part.get(readable[kind], "")))
    return "".join(out)


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event (JSON data; `event:` line when the protocol names its events)."""
    import json

    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"{head}data: {body}\n\n"
