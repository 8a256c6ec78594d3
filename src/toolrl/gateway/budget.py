"""The memory a served request may take: the keys and values of its sequences, stated as a budget and held to it.

A request's sequences (one per choice) hold, in the engine's KV cache, every position of their prompt and of the
tokens they may sample: `choices x (prompt + max new tokens) x bytes per token` (46,080 bytes for the default
model in fp32). The engine's cache is one buffer of slots as wide as its longest sequence, so the requests in
flight together take at most `sequences x longest x bytes per token`. `KVBudget` refuses in one line (400) a
request whose own need is past `per_request`, makes one wait while admitting it would take the requests in flight
past `total` (and refuses it, 503, when its turn does not come within `wait_s`), and the gateway gives the cache
back once nothing is in flight (Engine.trim_cache). Engines whose memory is not in this process (vLLM, an
endpoint) have no bytes per token: nothing is counted for them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from toolrl.gateway.turns import GatewayError

MB = 1 << 20
DEFAULT_REQUEST_MB = 1024
"""A request's own keys and values (the default model's whole 8k context is 360 MB per choice)."""
DEFAULT_TOTAL_MB = 4096
"""Every request in flight together."""
DEFAULT_KEEP_MB = 256
"""What the cache may keep between requests (larger: given back when nothing is in flight)."""


@dataclass
class KVBudget:
    bytes_per_token: int | None
    per_request: int = DEFAULT_REQUEST_MB * MB
    total: int = DEFAULT_TOTAL_MB * MB
    keep: int = DEFAULT_KEEP_MB * MB
    wait_s: float = 30.0
    held: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Request id -> (sequences, longest tokens) of the requests in flight."""
    refused: int = 0
    waited: int = 0
    _changed: asyncio.Condition | None = None

    def need(self, sequences: int, tokens: int) -> int:
        return sequences * tokens * (self.bytes_per_token or 0)

    def in_flight(self, extra: tuple[int, int] | None = None) -> int:
        """Bytes the requests in flight (and `extra`) take together: every sequence as wide as the longest."""
        every = [*self.held.values(), *([extra] if extra else [])]
        return self.need(sum(s for s, _ in every), max((t for _, t in every), default=0))

    async def admit(self, rid: str, sequences: int, tokens: int) -> None:
        """Hold room for a request of `sequences` of up to `tokens` each, waiting for it if need be; GatewayError
        where the request alone is past its budget or its turn does not come in time."""
        if not self.bytes_per_token:
            return
        own = self.need(sequences, tokens)
        if own > self.per_request or own > self.total:
            self.refused += 1
            limit = min(self.per_request, self.total)
            raise GatewayError(
                f"this request's keys and values would take {own / MB:,.0f} MB ({sequences} x {tokens:,} tokens), "
                f"past the server's {limit / MB:,.0f} MB a request (toolrl serve --max-request-mb); ask fewer "
                "tokens (max_tokens) or choices (n), or send a shorter conversation",
                param="max_tokens",
                code="request_too_large",
            )
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            if self.held and self.in_flight((sequences, tokens)) > self.total:
                self.waited += 1
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: self._fits(sequences, tokens)), self.wait_s)
                except TimeoutError:
                    self.refused += 1
                    raise GatewayError(
                        f"the server's requests in flight hold its {self.total / MB:,.0f} MB of keys and values "
                        f"(toolrl serve --max-kv-mb) and this one waited {self.wait_s:g} s for room; retry later",
                        503,
                        kind="overloaded_error",
                        code="server_busy",
                    ) from None
            self.held[rid] = (sequences, tokens)

    def _fits(self, sequences: int, tokens: int) -> bool:
        return not self.held or self.in_flight((sequences, tokens)) <= self.total

    async def release(self, rid: str) -> bool:
        """The request is over; True where nothing is in flight any more (the cache may be given back)."""
        if self.held.pop(rid, None) is not None and self._changed is not None:
            async with self._changed:
                self._changed.notify_all()
        return not self.held

    async def finished(self, rid: str, engine, stats: Counter[str], tries: int = 20) -> None:
        """The request's room is freed; once nothing is in flight the engine gives back a cache grown past `keep`
        (it finishes its last step first: asked again every 50 ms, up to a second), counted in `stats`."""
        if not await self.release(rid):
            return
        for _ in range(tries):
            given = await asyncio.to_thread(engine.trim_cache, self.keep)
            if given is not None or self.held:
                stats["cache_given_back"] += bool(given)
                return
            await asyncio.sleep(0.05)
