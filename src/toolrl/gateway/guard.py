"""The gateway's connections held to bounds before any request reaches the app: a cap on open connections (in all
and per client address), a smaller one on connections that have not yet sent a request with the key (so that a
flood of them cannot take the file descriptors keyed clients need), and a deadline for a request's headers to
arrive (a client that opens a connection and sends nothing, or its headers a byte at a time, is closed).

It is uvicorn's h11 connection with those checks added (`guarded_protocol`); the app marks a connection keyed
(`ConnectionGuard.keyed`) once a request on it has passed the key check."""

from __future__ import annotations

import logging
import resource
import threading
from collections import Counter
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("toolrl.gateway.server")

RESERVED_DESCRIPTORS = 256
"""File descriptors left to everything else of the process (tool servers, files, the engine)."""


def default_max_connections() -> int:
    """What the process's open-file limit leaves for connections (at most 4,096)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, min(4096, soft - RESERVED_DESCRIPTORS))


class ConnectionGuard:
    """Counts of a server's open connections; `admit` says whether one more may stay."""

    def __init__(
        self,
        max_connections: int | None = None,
        max_per_address: int | None = None,
        max_unkeyed: int = 64,
        header_timeout_s: float = 10.0,
    ):
        self.max_connections = max_connections or default_max_connections()
        self.max_per_address = max_per_address or self.max_connections
        self.max_unkeyed, self.header_timeout_s = max_unkeyed, header_timeout_s
        self.open: dict[tuple[str, int] | None, Any] = {}
        self.per_address: Counter[str] = Counter()
        self.unkeyed: set[tuple[str, int] | None] = set()
        self.refused: Counter[str] = Counter()
        """Connections closed at once, by why: connections, per_address, unkeyed; and header_timeout."""
        self.lock = threading.Lock()

    def admit(self, client: tuple[str, int] | None, connection: Any) -> str | None:
        """Keep the connection (None), or why not."""
        address = client[0] if client else ""
        with self.lock:
            why = None
            if len(self.open) >= self.max_connections:
                why = "connections"
            elif self.per_address[address] >= self.max_per_address:
                why = "per_address"
            elif len(self.unkeyed) >= self.max_unkeyed:
                why = "unkeyed"
            if why is not None:
                self.refused[why] += 1
                return why
            self.open[client] = connection
            self.per_address[address] += 1
            self.unkeyed.add(client)
        return None

    def release(self, client: tuple[str, int] | None) -> None:
        with self.lock:
            if self.open.pop(client, None) is not None:
                self.per_address[client[0] if client else ""] -= 1
            self.unkeyed.discard(client)

    def keyed(self, client: tuple[str, int] | None) -> None:
        """A request on this connection passed the key check: it no longer counts against max_unkeyed."""
        with self.lock:
            self.unkeyed.discard(client)


def guarded_protocol(guard: ConnectionGuard) -> type[H11Protocol]:
    """uvicorn's h11 connection, held to `guard`'s bounds."""

    class Guarded(H11Protocol):
        _header_timer = None
        _admitted = False

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            why = guard.admit(self.client, self)
            if why is not None:
                if guard.refused[why] == 1:  # the first of its kind
                    log.warning("gateway: a connection refused (%s at its bound; counted in the guard)", why)
                self.transport.abort()
                return
            self._admitted = True
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._admitted:
                guard.release(self.client)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
                self._disarm()  # the request's headers are in

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers are due in time too

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(guard.header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                guard.refused["header_timeout"] += 1
                self.transport.abort()

    return Guarded
