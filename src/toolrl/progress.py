"""Progress of work counted in items (an evaluation's tasks, a build's stages): done/total, rate and ETA as one
line, told at most every `every_s` seconds, at least every `every_s` seconds while the work runs (a heartbeat, even
when no item finished: a long batch had printed nothing for minutes), and once at the end, so a terminal, a log file
and a UI can follow a long evaluation that has no steps."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

PROGRESS_EVERY_S = 10.0
"""How often a line is told while work goes on (the first item and the last are always told)."""


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


def progress_line(
    what: str, done: int, total: int, elapsed_s: float, unit: str = "tasks", eta_s: float | None = None
) -> str:
    """'eval start: 12/50 tasks  0.80 tasks/s  eta 48 s' (the ETA from the rate unless `eta_s` is given; no rate
    before the first item is done, and then the time so far)."""
    line = f"{what}: {done}/{total} {unit}"
    if done and elapsed_s > 0:
        rate = done / elapsed_s
        line += f"  {rate:.2f} {unit}/s"
        if done < total:
            line += f"  eta {_seconds((total - done) / rate if eta_s is None else eta_s)}"
    elif done < total and elapsed_s >= 1:
        line += f"  {_seconds(elapsed_s)} so far" + (f"  eta {_seconds(eta_s)}" if eta_s is not None else "")
    return line + f"  {elapsed_s:.0f} s" if done == total else line


class Tally:
    """Counts finished items; tells `emit` a progress line when one is due. With `batch` (items run that many at a
    time, finishing together at the batch's end), the ETA is the mean time of the batches done times the batches
    left, less the time the current one has run: it counts down with the clock between batches instead of
    swinging as a batch's items land at once (18.5 -> 21.0 -> 2.5 min), and is not given before a batch is done."""

    def __init__(
        self,
        what: str,
        total: int,
        emit: Callable[[str], None],
        every_s: float = PROGRESS_EVERY_S,
        unit: str = "tasks",
        clock: Callable[[], float] = time.monotonic,
        batch: int = 1,
    ):
        self.what, self.total, self.emit, self.every_s, self.unit, self.clock = what, total, emit, every_s, unit, clock
        self.batch = max(1, batch)
        self.done = 0
        self.started = clock()
        self.told_at: float | None = None
        self.batch_ends: list[float] = []
        self.lock = threading.Lock()

    def eta(self, now: float) -> float | None:
        if self.batch == 1:
            return None  # progress_line's, from the rate
        if not self.batch_ends:
            return None
        per_batch = (self.batch_ends[-1] - self.started) / len(self.batch_ends)
        left = math.ceil(self.total / self.batch) - len(self.batch_ends)
        return max(0.0, per_batch * left - (now - self.batch_ends[-1]))

    def _tell(self, now: float) -> None:
        self.told_at = now
        self.emit(progress_line(self.what, self.done, self.total, now - self.started, self.unit, self.eta(now)))

    def advance(self, n: int = 1) -> None:
        with self.lock:
            self.done += n
            now = self.clock()
            finished = self.done // self.batch + (self.done >= self.total and self.done % self.batch > 0)
            self.batch_ends += [now] * (finished - len(self.batch_ends))  # batches that ended with this item
            if self.done >= self.total or self.told_at is None or now - self.told_at >= self.every_s:
                self._tell(now)

    def tick(self) -> None:
        """A line when none was told for `every_s` seconds (the heartbeat calls it)."""
        with self.lock:
            now = self.clock()
            if self.done < self.total and now - (self.told_at or self.started) >= self.every_s:
                self._tell(now)


class Heartbeat:
    """While open, a thread calls `tally.tick()` every second: a line at least every `every_s` seconds."""

    def __init__(self, tally: Tally):
        self.tally, self.stop = tally, threading.Event()
        self.thread = threading.Thread(target=self._run, name="progress-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            self.tally.tick()

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
