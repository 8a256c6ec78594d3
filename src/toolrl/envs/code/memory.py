"""One memory limit for all of a sandbox call's processes together (`memory_mb`), and one process count.

RLIMIT_AS bounds each process, so six processes of 400 MB each hold 2.4 GB under a 512 MB limit. What bounds
the total, in order of preference:
- a cgroup of the call's own (cgroup v2 where this process's cgroup delegates the memory and pids controllers,
  else the v1 memory and pids hierarchies where they are writable, as for root in a container): `memory.max` /
  `memory.limit_in_bytes` (swap included where the kernel counts it) and `pids.max`. The kernel refuses the
  allocation past the limit and its OOM killer kills a process of the call; the call's tool error says so;
- else a watch: the host sums the resident memory of the call's processes (the descendants of the process it
  started, from /proc) every WATCH_INTERVAL_S and kills them all past the limit. What it cannot stop is what
  they allocate between two looks (each process's RLIMIT_AS still bounds each one), and shared pages count once
  per process (it errs on the side of stopping).
A child process joins the cgroup between fork and exec (`join`), before any of the code runs.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.05
_counter = itertools.count()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.cache
def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of each cgroup mount, from /proc/self/mountinfo (read once: a box's
    start read it twice, 0.6 ms of its 6)."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[4], tail[0], set(tail[2].split(","))))
    return found


@functools.cache
def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path in it, from /proc/self/cgroup."""
    own = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    return own


def _v2_parent() -> Path | None:
    """Where a child cgroup with the memory and pids controllers can be made under cgroup v2, or None."""
    own = _own_cgroups().get("")
    for mount, fstype, _ in _mounts():
        if fstype != "cgroup2" or own is None:
            continue
        parent = Path(mount) / own.lstrip("/")
        with contextlib.suppress(OSError):
            if {"memory", "pids"} <= set((parent / "cgroup.subtree_control").read_text().split()):
                return parent
    return None


def _v1_parents() -> tuple[Path, Path | None] | None:
    """The v1 memory hierarchy's folder of this process (and the pids one's), when a child can be made there."""
    own = _own_cgroups()
    places: dict[str, Path] = {}
    for mount, fstype, options in _mounts():
        for controller in ("memory", "pids"):
            if fstype == "cgroup" and controller in options and controller in own:
                places[controller] = Path(mount) / own[controller].lstrip("/")
    memory = places.get("memory")
    if memory is None or not os.access(memory, os.W_OK) or not (memory / "memory.limit_in_bytes").exists():
        return None
    pids = places.get("pids")
    return memory, pids if pids is not None and os.access(pids, os.W_OK) else None


_swept: set[Path] = set()


def sweep_stale(parent: Path) -> int:
    """Remove the call cgroups a killed toolrl process left under `parent` (`toolrl-sandbox-PID-N` of a PID that no
    longer runs; rmdir removes only an empty cgroup, so nothing in use goes), once per parent per process; how many
    were removed. A process killed mid-call (SIGKILL, the machine's OOM killer) cannot remove its own."""
    if parent in _swept:
        return 0
    _swept.add(parent)
    removed = 0
    for folder in parent.glob("toolrl-sandbox-*-*"):
        pid = folder.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid() or _running(int(pid)):
            continue
        with contextlib.suppress(OSError):
            folder.rmdir()
            removed += 1
    if removed:
        log.info("removed %d cgroups left by stopped toolrl processes under %s", removed, parent)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


class CgroupBound:
    """A cgroup made for one sandbox call: memory (and process count) of all its processes together."""

    kind = "cgroup"

    def __init__(self, memory_bytes: int, max_processes: int) -> None:
        name = f"toolrl-sandbox-{os.getpid()}-{next(_counter)}"
        self.folders: list[Path] = []
        self.v2 = _v2_parent()
        try:
            if self.v2 is not None:
                sweep_stale(self.v2)
                folder = self.v2 / name
                folder.mkdir()
                self.folders.append(folder)
                (folder / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (folder / "memory.swap.max").write_text("0")
                (folder / "pids.max").write_text(str(max_processes))
            else:
                places = _v1_parents()
                if places is None:
                    raise OSError("no writable cgroup with a memory controller")
                memory, pids = places
                for parent in (memory, pids) if pids is not None else (memory,):
                    sweep_stale(parent)
                folder = memory / name
                folder.mkdir()
                self.folders.append(folder)
                (folder / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):  # swap counted too, where the kernel accounts it
                    (folder / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                if pids is not None:
                    (pids / name).mkdir()
                    self.folders.append(pids / name)
                    (pids / name / "pids.max").write_text(str(max_processes))
        except OSError:
            self.close()
            raise
        self._join = [str(folder / "cgroup.procs") for folder in self.folders]
        self.procs = self._join
        """The files a call's first process writes its pid to (sandbox.py's launcher)."""

    def join(self) -> None:
        """In the child between fork and exec: this process (and all it starts) into the call's cgroups."""
        pid = str(os.getpid())
        for procs in self._join:
            with open(procs, "w") as f:
                f.write(pid)

    def watch(self, pid: int) -> None:
        """Nothing to watch: the kernel holds the limit."""

    def exceeded(self) -> bool:
        """Whether the kernel killed a process of the call for memory (or refused it a page)."""
        return self.counts() > 0

    def counts(self) -> int:
        """The kernel's count of memory kills and refused pages in this cgroup so far."""
        folder = self.folders[0]
        try:
            if self.v2 is not None:
                events = dict(line.split() for line in (folder / "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", 0)) + int(events.get("max", 0))
            control = dict(line.split() for line in (folder / "memory.oom_control").read_text().splitlines())
            return int(control.get("oom_kill", 0)) + int((folder / "memory.failcnt").read_text())
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        """Remove the call's cgroups (they are empty once its processes ended; a straggler is killed first)."""
        for folder in reversed(self.folders):
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # a process still in it, being reaped
                    with contextlib.suppress(OSError, ValueError):
                        for pid in (folder / "cgroup.procs").read_text().split():
                            os.kill(int(pid), signal.SIGKILL)
                    time.sleep(0.02)
            else:
                log.warning("sandbox cgroup %s could not be removed", folder)
        self.folders = []


def _children() -> dict[int, list[int]]:
    """parent pid -> child pids, of every process this process can see (/proc/PID/stat)."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found


def resident_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total


class WatchBound:
    """The fallback: the host looks at the call's processes' resident memory and kills them all past the limit."""

    kind = "watch"

    def __init__(self, memory_bytes: int, max_processes: int) -> None:
        self.memory_bytes = memory_bytes
        self._exceeded = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak = 0

    procs: list[str] = []  # noqa: RUF012 - nothing to join
    """Nothing to join: the processes are found as the descendants of the one started."""

    def join(self) -> None:
        """Nothing to join: the processes are found as the descendants of the one started."""

    def watch(self, pid: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(pid,), name="sandbox-memory", daemon=True)
        self._thread.start()

    def _run(self, pid: int) -> None:
        while not self._done.wait(WATCH_INTERVAL_S):
            pids = descendants(pid)
            used = resident_bytes(pids)
            self.peak = max(self.peak, used)
            if used > self.memory_bytes:
                self._exceeded = True
                for victim in pids:
                    with contextlib.suppress(OSError):
                        os.kill(victim, signal.SIGKILL)
                return

    def exceeded(self) -> bool:
        return self._exceeded

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(1.0)


_cgroup_problem: list[str | None] = []
"""Why no cgroup could be made here, once tried ([None]: they can)."""


def memory_bound(memory_bytes: int, max_processes: int, wanted: str = "auto") -> CgroupBound | WatchBound:
    """The total memory bound of one call: `wanted` cgroup or watch, or auto (a cgroup where this machine lets
    toolrl make one, else the watch; which one is logged once)."""
    if wanted == "watch" or (wanted == "auto" and _cgroup_problem and _cgroup_problem[0] is not None):
        return WatchBound(memory_bytes, max_processes)
    try:
        bound = CgroupBound(memory_bytes, max_processes)
    except OSError as exc:
        if wanted == "cgroup":
            raise
        if not _cgroup_problem:
            log.info("sandbox memory: no cgroup can be made here (%s); the host watches each call's total", exc)
        _cgroup_problem[:] = [str(exc)]
        return WatchBound(memory_bytes, max_processes)
    _cgroup_problem[:] = [None]
    return bound


class SharedCgroup:
    """One cgroup for every call of a long-lived sandbox (a box): made once, each call's processes join it, each
    call's `exceeded` counts only its own events. Each call makes and removes its own cgroup otherwise (~7 ms a
    call here); a box's processes end with each call, so the cgroup is empty between calls."""

    kind = "cgroup"

    def __init__(self, bound: CgroupBound):
        self.bound, self.before = bound, bound.counts()

    @classmethod
    def make(cls, memory_bytes: int, max_processes: int, wanted: str) -> SharedCgroup | None:
        """A shared cgroup where `wanted` resolves to one, else None (the watch is per call)."""
        bound = memory_bound(memory_bytes, max_processes, wanted)
        if isinstance(bound, CgroupBound):
            return cls(bound)
        bound.close()
        return None

    def call(self) -> SharedCgroup:
        self.before = self.bound.counts()
        return self

    @property
    def procs(self) -> list[str]:
        return self.bound.procs

    def join(self) -> None:
        self.bound.join()

    def watch(self, pid: int) -> None:
        """Nothing to watch: the kernel holds the limit."""

    def exceeded(self) -> bool:
        return self.bound.counts() > self.before

    def close(self) -> None:
        """Kept for the next call (`release` removes it)."""

    def release(self) -> None:
        self.bound.close()


def cgroups_left() -> list[str]:
    """This process's call cgroups that still exist (each call removes its own when it ends): [] when clean."""
    parents: list[Path] = []
    with contextlib.suppress(OSError):
        v2 = _v2_parent()
        if v2 is not None:
            parents.append(v2)
        else:
            places = _v1_parents()
            parents += [p for p in places or () if p is not None]
    return [str(p) for parent in parents for p in parent.glob(f"toolrl-sandbox-{os.getpid()}-*")]
