"""Intra-op threads as the machine allows: fewer while other work holds the cores.

A matrix product split over torch's threads waits at its end for the slowest of them. With every core taken by
other processes (a second run, a test suite beside it), one of ours is descheduled in most products and the step
waits a time slice for it, many times a forward: a standalone evaluation of 4 tasks took 87 s with 2 threads beside
a training run where 1 thread took 20 s (and 2 threads 9 s on an idle machine). `adapt()` is called by a thread
before its heavy work (an engine step, a micro-batch); every `INTERVAL_S` it reads the machine's CPU pressure
(Linux's pressure stall information: the share of the last 10 s in which some task waited for a CPU) and runs this
thread's products on one thread while it is above `HIGH`, on the thread count it started with once it falls below
`LOW`. torch's thread count is per thread (OpenMP's), so the engine's thread and the trainer's adapt apart.
Where /proc/pressure/cpu is missing, or TOOLRL_ADAPT_THREADS=0, nothing changes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

PRESSURE = Path("/proc/pressure/cpu")
INTERVAL_S = 2.0
HIGH = 25.0
"""avg10 of "some" CPU pressure (%) above which a thread's products run on one thread."""
LOW = 10.0
"""...and below which they run on the thread count the thread started with again."""

_local = threading.local()
changes = {"fewer": 0, "restored": 0}
"""How often a thread went down to one thread and back (the run's `cpu_threads_*` counts)."""


def cpu_pressure() -> float | None:
    """The share (%) of the last 10 s in which some runnable task waited for a CPU, or None where not reported."""
    try:
        first = PRESSURE.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = dict(part.split("=", 1) for part in first.split()[1:] if "=" in part)
    try:
        return float(fields["avg10"])
    except (KeyError, ValueError):
        return None


def enabled() -> bool:
    return os.environ.get("TOOLRL_ADAPT_THREADS", "1") != "0" and cpu_pressure() is not None


class _Governor:
    def __init__(self, wanted: int, active: bool):
        self.wanted, self.active = wanted, active
        self.now = wanted
        self.checked = 0.0

    def tick(self, torch) -> int:
        clock = time.monotonic()
        if not self.active or clock - self.checked < INTERVAL_S or self.wanted <= 1:
            return self.now
        self.checked = clock
        pressure = cpu_pressure()
        if pressure is None:
            return self.now
        want = 1 if pressure > HIGH else self.wanted if pressure < LOW else self.now
        if want != self.now:
            torch.set_num_threads(want)
            changes["fewer" if want < self.now else "restored"] += 1
            log.info("CPU pressure %.0f%%: products on %d thread(s) in %s (was %d)", pressure, want,
                     threading.current_thread().name, self.now)  # fmt: skip
            self.now = want
        return self.now


def adapt() -> int:
    """This thread's intra-op thread count for its next piece of work, lowered to one while the CPU is contended."""
    import torch

    governor = getattr(_local, "governor", None)
    if governor is None:
        governor = _local.governor = _Governor(torch.get_num_threads(), enabled())
    return governor.tick(torch)
