"""`memory_mb` bounds the sandbox, all its processes together, under every isolation and both bounds (a cgroup of
the call's own, or the host's watch where no cgroup can be made): six processes of 400 MB at 512 MB are stopped
with a tool error that says so, a program within the limit runs, and no cgroup is left behind."""

import logging
import os
import subprocess
import sys

import pytest

from toolrl.envs.code import memory
from toolrl.envs.code.sandbox import Sandbox, SandboxLimits, run_python
from toolrl.tools.limits import ToolFailed

SIX = """import subprocess, sys
program = "b = b'1' * (400 << 20); import time; time.sleep(2); print('held')"
procs = [subprocess.Popen([sys.executable, "-c", program]) for _ in range(6)]
print(sum(p.wait() == 0 for p in procs), "of 6 held 400 MB")
"""
WITHIN = "b = b'1' * (300 << 20)\nprint(len(b) >> 20, 'MB held')"


def cgroup_usable() -> bool:
    try:
        memory.CgroupBound(1 << 30, 8).close()
    except OSError:
        return False
    return True


BOUNDS = ["watch", pytest.param("cgroup", marks=pytest.mark.skipif(not cgroup_usable(), reason="no cgroup here"))]


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("isolation", ["bubblewrap", "unshare"])
def test_six_processes_of_400_mb_at_512_are_stopped_with_a_clear_tool_error(isolation, bound):
    box = Sandbox(SandboxLimits(timeout_s=30, memory_mb=512, isolation=isolation, memory_bound=bound))
    try:
        with pytest.raises(ToolFailed, match=r"more than 512 MB of memory \(all its processes together\)") as failed:
            run_python(SIX, box)
        held = [line for line in str(failed.value).splitlines() if line.endswith("of 6 held 400 MB")]
        assert not held or int(held[0].split()[0]) <= 1, failed.value  # at most one 400 MB process at a time
        assert run_python(WITHIN, box) == "300 MB held"  # within the limit: runs, in the same sandbox
    finally:
        box.close()


@pytest.mark.skipif(not cgroup_usable(), reason="no cgroup here")
def test_each_call_gets_a_cgroup_that_is_gone_after_it():
    bound = memory.CgroupBound(256 << 20, 8)
    parents = [folder.parent for folder in bound.folders]
    bound.close()
    box = Sandbox(SandboxLimits(timeout_s=10, memory_mb=256, isolation="bubblewrap", memory_bound="cgroup"))
    try:
        assert run_python("print('ok')", box) == "ok"
    finally:
        box.close()
    mine = f"toolrl-sandbox-{os.getpid()}-*"  # this process's: another test process may be making its own now
    assert not [p for parent in parents for p in parent.glob(mine)]


def test_cgroups_left_by_a_killed_process_are_swept_and_a_running_ones_kept(monkeypatch):
    """A process killed mid-call (SIGKILL, the OOM killer) cannot remove its call's cgroup: the next process that
    makes one removes those of processes no longer running (empty ones only), and keeps a running process's."""
    bound = memory.CgroupBound(256 << 20, 8)
    parents = [folder.parent for folder in bound.folders]
    bound.close()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = [parent / f"toolrl-sandbox-{int(dead.stdout)}-0" for parent in parents]
        kept = [parent / f"toolrl-sandbox-{alive.pid}-0" for parent in parents]
        for folder in left + kept:
            folder.mkdir()
        monkeypatch.setattr(memory, "_swept", set())  # as a fresh process has it
        memory.CgroupBound(256 << 20, 8).close()
        assert not any(f.exists() for f in left) and all(f.exists() for f in kept)
    finally:
        alive.kill()
        alive.wait()
        for folder in kept:
            folder.rmdir()


def test_auto_falls_back_to_the_watch_where_no_cgroup_can_be_made(monkeypatch, caplog):
    monkeypatch.setattr(memory, "_v2_parent", lambda: None)
    monkeypatch.setattr(memory, "_v1_parents", lambda: None)
    monkeypatch.setattr(memory, "_cgroup_problem", [])
    with caplog.at_level(logging.INFO, logger="toolrl.envs.code.memory"):
        assert isinstance(memory.memory_bound(512 << 20, 8), memory.WatchBound)
    assert "no cgroup can be made here" in caplog.text
    with pytest.raises(OSError, match="no writable cgroup"):
        memory.memory_bound(512 << 20, 8, "cgroup")  # asked for by name: refused, not quietly watched
