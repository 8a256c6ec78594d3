"""Responses kept for the Responses API's `previous_response_id` (what a response with `store` leaves behind): each
one's conversation, per sample, the oldest dropped past a bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from toolrl.gateway.turns import GatewayError
from toolrl.text import clip


class ResponseStore:
    """Responses kept for previous_response_id: their conversations, per sample, the oldest dropped past `limit`."""

    def __init__(self, limit: int):
        self.limit = limit
        self.kept: OrderedDict[str, tuple[str | None, list[dict[str, Any]], dict[str, Any]]] = OrderedDict()
        self.lock = threading.Lock()

    def keep(self, rid: str, sample: str | None, conversation: list[dict[str, Any]], response: dict[str, Any]):
        with self.lock:
            self.kept[rid] = (sample, conversation, response)
            while len(self.kept) > self.limit:
                self.kept.popitem(last=False)

    def get(self, rid: str, sample: str | None, param: str = "previous_response_id"):
        with self.lock:
            found = self.kept.get(rid)
        if found is None or found[0] != sample:
            raise GatewayError(f"{param}: no stored response {clip(rid, 60)!r} (kept with store: true, the last "
                               f"{self.limit} of this run's agent)", 404, param=param,
                               kind="not_found_error")  # fmt: skip
        return found

    def drop(self, sample: str | None, rid: str | None = None) -> None:
        with self.lock:
            for key in [k for k, v in self.kept.items() if v[0] == sample and rid in (None, k)]:
                del self.kept[key]
