"""Progress of work counted in items (an evaluation's tasks, a build's stages): done/total, rate and ETA as one
line, told at most every `every_s` seconds and once at the end, so a terminal, a log file and a UI can follow a
long evaluation that has no steps."""

from __future__ import annotations

import time
from collections.abc import Callable

PROGRESS_EVERY_S = 10.0
"""How often a line is told while work goes on (the first item and the last are always told)."""


def progress_line(what: str, done: int, total: int, elapsed_s: float, unit: str = "tasks") -> str:
    """'eval start: 12/50 tasks  0.80 tasks/s  eta 48 s' (no rate or ETA before the first item is done)."""
    line = f"{what}: {done}/{total} {unit}"
    if done and elapsed_s > 0:
        rate = done / elapsed_s
        line += f"  {rate:.2f} {unit}/s"
        if done < total:
            left = (total - done) / rate
            line += f"  eta {left:.0f} s" if left < 120 else f"  eta {left / 60:.1f} min"
    return line + f"  {elapsed_s:.0f} s" if done == total else line


class Tally:
    """Counts finished items; tells `emit` a progress line when one is due."""

    def __init__(
        self,
        what: str,
        total: int,
        emit: Callable[[str], None],
        every_s: float = PROGRESS_EVERY_S,
        unit: str = "tasks",
        clock: Callable[[], float] = time.monotonic,
    ):
        self.what, self.total, self.emit, self.every_s, self.unit, self.clock = what, total, emit, every_s, unit, clock
        self.done = 0
        self.started = clock()
        self.told_at: float | None = None

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if self.done >= self.total or self.told_at is None or now - self.told_at >= self.every_s:
            self.told_at = now
            self.emit(progress_line(self.what, self.done, self.total, now - self.started, self.unit))
