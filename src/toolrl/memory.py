"""Giving freed memory back to the operating system.

PyTorch's CPU allocator takes each tensor from malloc. glibc serves large blocks with mmap only up to a
threshold that it raises as blocks are freed (up to 32 MB), so after a training step most activations were
served from the heap, and the heap's freed middle is not returned: a run's resident memory grows with each
step's fragmentation. `trim()` (glibc's malloc_trim) returns free heap pages after a phase; it costs
milliseconds and changes no result. Elsewhere than glibc it does nothing.

Within a step, that fragmentation is the peak itself once sequences are long: a LoRA warm start on two
6.5k-token conversations peaked at 8.2 GB with glibc's moving threshold and 2.5 GB with blocks above 1 MiB always
mapped (bench/long_context.py), for ~20% more time in page faults. `bound_heap()` fixes the threshold; the update
and the warm start call it when a micro-batch's sequences are LONG_SEQUENCE tokens or longer, or one trajectory's
linked segments are together (a long horizon: the long-horizon recipe's update peaked 0.44 GB lower with it).
The cost, measured on a 4.9k-token GRPO step: 5.8-8 million faults, 12-13% of its CPU time in the kernel;
thresholds of 16 MiB and more cut the faults by 61-80% and put the rollout's peak above 4 GB (bench/kernels/heap.py,
docs/benchmarks.md). So
bound_heap() also installs a cache of freed large blocks, by size (models/native/block_cache.py), of at most
`model.cpu_block_cache_mb` (keep_blocks); trim() empties it.

`meter` measures the peak resident memory of a run and of each of its phases, as the OS reports it (PeakMeter).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def _block_cache():
    """models/native/block_cache where bound_heap imported it, else None (importing it would import torch)."""
    return sys.modules.get("toolrl.models.native.block_cache")


def trim() -> bool:
    """Return free heap memory and the kept blocks to the system; True where glibc did so."""
    cache = _block_cache()
    if cache is not None:
        cache.flush()
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


LONG_SEQUENCE = 2048
"""From this many tokens in one sequence, blocks above MMAP_THRESHOLD are mapped (bound_heap)."""
MMAP_THRESHOLD = 1 << 20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_block_cache_mb: int | None = None
"""keep_blocks' MB; None until a run sets it: model.cpu_block_cache_mb's default then."""


def keep_blocks(mb: int) -> None:
    """How many MB of freed large blocks bound_heap's cache may keep (model.cpu_block_cache_mb; 0: none). Set
    when a run's model loads; where the heap is already bounded, it applies now."""
    global _block_cache_mb
    _block_cache_mb = mb
    if bound_heap.cache_info().currsize:
        _install_block_cache()


def _install_block_cache() -> bool:
    from toolrl.config.schema import ModelConfig
    from toolrl.models.native import block_cache

    default = ModelConfig.model_fields["cpu_block_cache_mb"].default
    return block_cache.install(default if _block_cache_mb is None else _block_cache_mb)


@functools.cache
def bound_heap() -> bool:
    """Serve every block above MMAP_THRESHOLD with mmap from now on (glibc's mallopt, which also stops the
    threshold moving): freed activations go back to the system at once instead of fragmenting the heap; and keep
    PyTorch's freed blocks from 1 MiB for the next request of their size, up to keep_blocks' MB, which spares
    most of the page faults that mapping them again would cost (models/native/block_cache.py). Once per process;
    True where glibc's threshold was set."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    log.info("long sequences: blocks above %d KiB are mapped, not kept in the heap", MMAP_THRESHOLD >> 10)
    _install_block_cache()
    return done


def for_sequences(longest: int) -> None:
    """bound_heap() when a forward pass is about to run sequences (or one episode's linked segments) of
    LONG_SEQUENCE tokens or more."""
    if longest >= LONG_SEQUENCE:
        bound_heap()


def _status_kb(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def rss_gb() -> float | None:
    """This process's resident memory now, in GB (None where /proc is not available)."""
    kb = _status_kb("VmRSS")
    return None if kb is None else kb / 1024**2


def _rss_now_gb() -> float | None:
    """This process's resident set now, from /proc/self/statm (one short line: the sampler reads it 50 times a
    second)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * PAGE / 1024**3


PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (tool workers, MCP servers, engine processes), from /proc/PID/task/*/children."""
    found, todo = [], [pid]
    while todo:
        try:  # a process may end while it is read: it has no children left to count
            tasks = list(Path(f"/proc/{todo.pop()}/task").glob("*/children"))
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError, ValueError):
                children = [int(c) for c in task.read_text().split()]
                found.extend(children)
                todo.extend(children)
    return found


def children_rss_gb() -> float:
    """The resident sets of this process's descendants, summed (GB; 0 where there are none or /proc is missing)."""
    total = 0
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return total * PAGE / 1024**3


MEASURE = (
    "the toolrl process's max resident set (VmHWM), as /usr/bin/time -v and getrusage report it; its tool "
    "and server processes apart (children_peak_gb, their summed resident sets at the highest sample)"
)
"""What a run's peak memory figure is, written beside it (RUN/memory.json)."""


class PeakMeter:
    """The peak resident memory of this process during each named phase of a run (rollout, update, eval, ...),
    and over the whole run, as the operating system reports it.

    The run's peak is the kernel's own high-water mark (VmHWM): what `/usr/bin/time -v` prints as "Maximum resident
    set size" and getrusage's ru_maxrss give for this process. A phase's peak is the highest resident set a sampler
    thread read during it (every `interval_s`), or the mark itself where the mark rose during the phase (the run's
    peak was reached in it). Memory an earlier phase left allocated counts, as it does in the run; a phase nested in
    another counts in both. The processes below this one (tool workers, servers) are sampled apart, every
    `children_every` samples, as `children_peak` (their sum).

    `exact` (benchmarks measuring a short call's peak): each phase resets the kernel's mark (/proc/self/clear_refs,
    "5") and reads it at the end, which catches peaks shorter than the sampler's interval, but then the operating
    system's max RSS of the process covers only the time since the last reset. The meter had done this by default:
    `make demo` printed 3.6 GB where GNU time said 2.24 GB, its last phase's. Where /proc is missing nothing is
    measured (`available` False)."""

    def __init__(self, interval_s: float = 0.02, children_every: int = 25) -> None:
        self.peaks: dict[str, float] = {}
        """Phase -> its highest peak so far (GB)."""
        self.last: dict[str, float] = {}
        """Phase -> the peak of its latest occurrence (GB)."""
        self.overall = 0.0
        self.children_peak = 0.0
        """The highest sum of the descendants' resident sets a sample saw (GB)."""
        self.exact = False
        self.interval_s, self.children_every = interval_s, children_every
        self._open: list[list] = []  # [name, peak so far]
        self._lock = threading.Lock()
        self._sampler: threading.Thread | None = None
        self.available = _status_kb("VmHWM") is not None and _rss_now_gb() is not None

    def _sample(self) -> None:
        count = 0
        while True:
            time.sleep(self.interval_s)
            rss = _rss_now_gb()
            count += 1
            children = children_rss_gb() if count % self.children_every == 0 else 0.0
            with self._lock:
                self.children_peak = max(self.children_peak, children)
                for entry in self._open:
                    entry[1] = max(entry[1], rss or 0.0)

    def _start_sampler(self) -> None:
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._sample, name="toolrl-memory", daemon=True)
            self._sampler.start()

    @staticmethod
    def _mark() -> float:
        return (_status_kb("VmHWM") or 0) / 1024**2

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.available:
            yield
            return
        self._start_sampler()
        if self.exact:
            self._fold(self._mark())
            self._reset()
        mark = self._mark()
        entry = [name, _rss_now_gb() or 0.0]
        with self._lock:
            self._open.append(entry)
        try:
            yield
        finally:
            end = self._mark()
            with self._lock:
                self._open.remove(entry)
                peak = max(entry[1], _rss_now_gb() or 0.0)
                if self.exact or end > mark:  # the mark rose during the phase (or was reset at its start)
                    peak = max(peak, end)
                for outer in self._open:
                    outer[1] = max(outer[1], peak)
            self.overall = max(self.overall, end, peak)  # a sample may exceed the mark the kernel updates lazily
            self.last[name] = round(peak, 3)
            self.peaks[name] = round(max(self.peaks.get(name, 0.0), peak), 3)
            if self.exact:
                self._reset()

    @staticmethod
    def _reset() -> None:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")

    def _fold(self, peak: float) -> None:
        self.overall = max(self.overall, peak)
        with self._lock:
            for entry in self._open:
                entry[1] = max(entry[1], peak)

    def metrics(self, phases: tuple[str, ...]) -> dict[str, float]:
        """The latest peak of each phase and the resident memory now (GB), as run metrics (`memory/PHASE_peak_gb`,
        `memory/rss_gb`; none where the platform does not give them), and where long sequences installed the
        block cache, the large blocks it served from kept ones and those it mapped anew."""
        out = {f"memory/{p}_peak_gb": self.last[p] for p in phases if p in self.last}
        now = rss_gb()
        if now is not None:
            out["memory/rss_gb"] = round(now, 3)
        cache = _block_cache()
        counts = cache.stats() if cache is not None else None
        if counts is not None:  # since the process started: requests served by a kept block, and the others
            out |= {"memory/kept_block_hits": counts.hits, "memory/kept_block_misses": counts.misses}
        return out

    def current_overall(self) -> float:
        """The peak so far over the process's life (GB): the kernel's high-water mark, as the operating system
        reports the process's max resident set (with `exact`, the highest mark read between resets)."""
        if self.available:
            self.overall = max(self.overall, self._mark())
        return round(self.overall, 3)


meter = PeakMeter()
"""The process's meter (memory is per process): the trainer, the warm start and the evaluation mark their phases
on it; RUN/memory.json and each step's `memory/*` metrics read it."""
