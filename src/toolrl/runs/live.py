"""Where a running step is (RUN/live.json): its phase (rollout k/n trajectories, scoring, update micro-batch k/n),
since when, and the phase's ETA, rewritten as the step moves (at most every `every_s`, and at each phase change),
so that the UI shows a step that runs for minutes (a 5k-token prompt's) instead of "step 0/2"."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

LIVE = "live.json"
LIVE_EVERY_S = 2.0
"""Most often live.json is rewritten within a phase (the UI polls every 2 s; the issue asks for 5 s at worst)."""


def phase_eta(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left in a phase counted in items, from its rate so far (None before the first item)."""
    if done <= 0 or total <= 0 or done >= total:
        return None
    return elapsed_s / done * (total - done)


class LiveStep:
    """Writes live.json through `write(name, value)` (RunDir.write_json); nothing without a run directory."""

    def __init__(self, write: Callable[[str, Any], None] | None, steps: int, trajectories: int,
                 every_s: float = LIVE_EVERY_S, clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.write, self.steps, self.trajectories, self.every_s, self.clock = write, steps, trajectories, every_s, clock
        self.state: dict[str, Any] = {}
        self.written_at = 0.0
        self.lock = threading.Lock()

    def begin(self, step: int) -> None:
        """A step starts: its rollout, `trajectories` to make."""
        now = self.clock()
        self.state = {"step": step, "steps": self.steps, "started_at": now}
        self._phase("rollout", self.trajectories, "trajectories")

    def finished_one(self) -> None:
        """A trajectory of the step's rollout ended (Rollout.on_finished); after the last: scoring."""
        with self.lock:
            if self.state.get("phase") != "rollout":
                return
            self.state["done"] += 1
            if self.state["done"] >= self.state["total"]:
                self._phase("scoring", 0, "")
            else:
                self._save(force=False)

    def counted(self, scores: Callable, micro_batches: int) -> Callable:
        """`scores` (the update's forward pass per micro-batch), counting micro-batches: the update phase."""
        self._phase("update", micro_batches, "micro-batches")

        def counting(*args, **kwargs):
            out = scores(*args, **kwargs)
            with self.lock:
                self.state["done"] += 1
                self._save(force=self.state["done"] >= self.state["total"])  # the last: always said
            return out

        return counting

    def _phase(self, name: str, total: int, unit: str) -> None:
        now = self.clock()
        self.state |= {"phase": name, "done": 0, "total": total, "unit": unit, "phase_started_at": now}
        self._save(force=True)

    def _save(self, force: bool) -> None:
        now = self.clock()
        if self.write is None or not self.state or (not force and now - self.written_at < self.every_s):
            return
        s = self.state
        eta = phase_eta(s["done"], s["total"], now - s["phase_started_at"])
        self.write(LIVE, {**s, "updated_at": now, "phase_eta_s": None if eta is None else round(eta, 1)})
        self.written_at = now
