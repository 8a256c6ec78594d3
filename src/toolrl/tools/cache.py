"""Tool-result cache keyed by tool name and canonical arguments: in-memory LRU, optionally backed by sqlite."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any


def cache_key(tool: str, arguments: dict[str, Any]) -> str:
    """The same call always gives the same key, whatever the order of its arguments."""
    return tool + "\x00" + json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


class ResultCache:
    """LRU of observation texts; with `path`, misses fall through to (and hits are written to) sqlite."""

    def __init__(self, max_entries: int = 10_000, path: str | Path | None = None):
        self.max_entries = max_entries
        self._memory: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._db = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, content TEXT NOT NULL)")
            self._db.commit()

    def get(self, key: str) -> str | None:
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key]
            if self._db is None:
                return None
            row = self._db.execute("SELECT content FROM results WHERE key = ?", (key,)).fetchone()
        if row is not None:
            self._remember(key, row[0])
            return row[0]
        return None

    def put(self, key: str, content: str) -> None:
        self._remember(key, content)
        if self._db is not None:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO results (key, content) VALUES (?, ?)", (key, content))
                self._db.commit()

    def _remember(self, key: str, content: str) -> None:
        with self._lock:
            self._memory[key] = content
            self._memory.move_to_end(key)
            while len(self._memory) > self.max_entries:
                self._memory.popitem(last=False)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
