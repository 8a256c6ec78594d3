"""Intra-op threads on a machine that other work shares.

`open_pool()`: the main thread runs one small parallel product before any worker thread runs torch's. Beside a
process that held both cores, a standalone `toolrl eval` whose first parallel product ran in the engine's worker
thread took 122 s for 4 tasks, and 30 s after one 512 x 512 product on the main thread first, with the same tokens
and log-probs; a training run's evaluation after its first update was fast for that reason. The hf engine calls it
when it is made.

`adapt()` (opt-in: TOOLRL_ADAPT_THREADS=1): the hf engine's thread calls it before each step of its work; every
`INTERVAL_S` it reads the machine's CPU pressure (Linux's pressure stall information: the share of the last 10 s in
which some task waited for a CPU) and runs this thread's products on one thread while it is above `HIGH`, on the
count it started with once it falls below `LOW` (torch's count is per thread: OpenMP's). Beside a busy process it
took that evaluation from 90 s to 36 s; but the thread count changes a product's last bits (a weight gradient's or
a decode step's sums are split over threads), so a run's results then depend on the load it met: off by default.
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
    return os.environ.get("TOOLRL_ADAPT_THREADS", "0") == "1" and cpu_pressure() is not None


_opened = threading.Event()


def open_pool() -> None:
    """One small parallel product on the main thread, once per process (a no-op from any other thread)."""
    if _opened.is_set() or threading.current_thread() is not threading.main_thread():
        return
    import torch

    a = torch.ones(512, 512)
    a @ a
    _opened.set()


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
