"""A sqlite database per trajectory, copied from one template in memory, and SQL run under limits."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

from toolrl.errors import DataError
from toolrl.files import read_text


def bundled_script() -> str:
    return (resources.files("toolrl.envs.nl2sql") / "data" / "shop.sql").read_text(encoding="utf-8")


def load_template(path: str | None) -> sqlite3.Connection:
    """The template database in memory: from a sqlite file, a .sql script, or the bundled shop."""
    template = sqlite3.connect(":memory:", check_same_thread=False)
    if path is None:
        template.executescript(bundled_script())
        return template
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"env.options.database: {file} not found; give a sqlite file or a .sql script")
    try:
        if file.suffix == ".sql":
            template.executescript(read_text(file, "SQL script", DataError, max_bytes=None))
        else:
            source = sqlite3.connect(f"file:{file}?mode=ro", uri=True)
            source.backup(template)
            source.close()
    except sqlite3.Error as exc:
        raise DataError(f"env.options.database: {file} is not a usable sqlite database or script ({exc})") from None
    return template


def schema_text(db: sqlite3.Connection) -> str:
    rows = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL ORDER BY name")
    return "\n".join(" ".join(sql.split()) + ";" for (sql,) in rows)


class Database:
    """One trajectory's own copy of the template: writes stay in it. Queries are serialised on a lock (a
    turn's calls may run on several worker threads) and interrupted after `timeout_s`."""

    def __init__(self, template: sqlite3.Connection, timeout_s: float = 2.0, max_rows: int = 20):
        self.conn = sqlite3.connect(":memory:", check_same_thread=False)
        template.backup(self.conn)
        self.timeout_s, self.max_rows = timeout_s, max_rows
        self.lock = threading.Lock()

    def run(self, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Column names and every row; raises sqlite3.Error (a timeout is an OperationalError 'interrupted')."""
        with self.lock:
            deadline = time.monotonic() + self.timeout_s
            self.conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
            try:
                cursor = self.conn.execute(query)
                rows = cursor.fetchall()
                columns = [d[0] for d in cursor.description or []]
                self.conn.commit()
                return columns, rows
            finally:
                self.conn.set_progress_handler(None, 0)

    def close(self) -> None:
        self.conn.close()


def format_rows(columns: list[str], rows: list[tuple[Any, ...]], max_rows: int) -> str:
    if not columns:
        return "OK (no rows returned)"
    lines = [" | ".join(columns)] + [
        " | ".join("NULL" if v is None else str(v) for v in row) for row in rows[:max_rows]
    ]
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more rows")
    return "\n".join(lines) if rows else " | ".join(columns) + "\n(0 rows)"


def _normalize(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def same_results(predicted: list[tuple[Any, ...]], gold: list[tuple[Any, ...]], ordered: bool) -> bool:
    """Result sets equal: in order when the gold query orders its rows, else as multisets of rows."""
    left = [tuple(_normalize(v) for v in row) for row in predicted]
    right = [tuple(_normalize(v) for v in row) for row in gold]
    return left == right if ordered else Counter(left) == Counter(right)
