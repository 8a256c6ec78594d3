"""Responses kept for the Responses API's `previous_response_id` (what a response with `store` leaves behind): each
one's conversation, per sample, the oldest dropped past a count and past a size in bytes (a response echoes its
request's tools and metadata: 75 stored 6 MiB requests held 474 MB before the size bound)."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from toolrl.gateway.turns import GatewayError
from toolrl.text import clip

log = logging.getLogger(__name__)

MAX_STORED_BYTES = 256 << 20
"""What the kept responses may hold together (their conversations and the responses as sent, as JSON)."""


class ResponseStore:
    """Responses kept for previous_response_id: their conversations, per sample, the oldest dropped past `limit`."""

    def __init__(self, limit: int, max_bytes: int = MAX_STORED_BYTES):
        self.limit, self.max_bytes = limit, max_bytes
        self.kept: OrderedDict[str, tuple[str | None, list[dict[str, Any]], dict[str, Any]]] = OrderedDict()
        self.sizes: dict[str, int] = {}
        self.bytes = 0
        self.dropped = 0
        """Responses dropped to keep within the bounds (oldest first), or never kept (one alone past max_bytes)."""
        self.lock = threading.Lock()

    def keep(self, rid: str, sample: str | None, conversation: list[dict[str, Any]], response: dict[str, Any]):
        size = len(json.dumps(conversation)) + len(json.dumps(response))
        with self.lock:
            if size > self.max_bytes:
                self.dropped += 1
                log.warning("gateway: a response of %d bytes is past the store's %d and is not kept for "
                            "previous_response_id", size, self.max_bytes)  # fmt: skip
                return
            self.kept[rid], self.sizes[rid] = (sample, conversation, response), size
            self.bytes += size
            while len(self.kept) > self.limit or self.bytes > self.max_bytes:
                old, _ = self.kept.popitem(last=False)
                self.bytes -= self.sizes.pop(old)
                self.dropped += 1

    def get(self, rid: str, sample: str | None, param: str = "previous_response_id"):
        with self.lock:
            found = self.kept.get(rid)
        if found is None or found[0] != sample:
            raise GatewayError(f"{param}: no stored response {clip(rid, 60)!r} (kept with store: true, the last "
                               f"{self.limit} of this run's agent)", 404, param=param,
                               kind="not_found_error")  # fmt: skip
        return found

    def item(self, item_id: str, sample: str | None) -> dict[str, Any] | None:
        """An output item (a message or a function call) of a kept response of this sample, by its id: what an
        `item_reference` names (the Vercel AI SDK sends its own earlier turns so)."""
        with self.lock:
            for owner, _, response in reversed(self.kept.values()):
                if owner == sample:
                    found = next((i for i in response.get("output", []) if i.get("id") == item_id), None)
                    if found is not None:
                        return found
        return None

    def drop(self, sample: str | None, rid: str | None = None) -> None:
        with self.lock:
            for key in [k for k, v in self.kept.items() if v[0] == sample and rid in (None, k)]:
                del self.kept[key]
                self.bytes -= self.sizes.pop(key)
