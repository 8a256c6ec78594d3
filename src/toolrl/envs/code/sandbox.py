"""Run Python code in a subprocess with limits. What it does and does not protect against, honestly:

- time: a wall-clock timeout kills the whole process group; CPU time is limited to the same (RLIMIT_CPU);
- memory: the address space is limited (RLIMIT_AS), so large allocations fail with MemoryError;
- files: the code runs in its own temporary directory (removed at the end of the episode), files it writes
  are limited in size (RLIMIT_FSIZE), at most 64 open files (RLIMIT_NOFILE); it can still read any file the
  user running toolrl can read;
- output: stdout and stderr go to a file (bounded by the file size limit) and are cut to `max_output_chars`
  (head and tail kept);
- network: a new network namespace (no interfaces) where the kernel allows it (`network_isolated()` says
  whether it does here); otherwise only Python's socket module is disabled in the child, which code going
  through ctypes or another program can get around;
- environment: an empty environment except PATH, HOME (the directory) and LANG; Python in isolated mode
  (-I: no user site-packages, no PYTHONPATH).
It is a guard against a model's accidents (an infinite loop, a runaway allocation, a stray write), not a
security boundary against code written to escape: run untrusted models inside a container or VM.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_BOOT = """
import socket, sys, traceback
def _blocked(*args, **kwargs):
    raise OSError("network access is disabled in this sandbox")
if not {isolated}:
    socket.socket.connect = socket.socket.connect_ex = socket.create_connection = _blocked
    socket.getaddrinfo = _blocked
sys.argv = ["main.py"]
with open("main.py", encoding="utf-8") as f:
    source = f.read()
try:
    exec(compile(source, "main.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
except SystemExit:
    raise
except BaseException as exc:  # the traceback from the model's own code, without this bootstrap's frame
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 2000
    max_file_mb: int = 10


def _unshare_network() -> bool:
    try:
        os.unshare(os.CLONE_NEWNET)
        return True
    except (AttributeError, OSError):
        return False


@functools.cache
def network_isolated() -> bool:
    """Whether this machine lets a child process start in a network namespace of its own."""
    if not hasattr(os, "unshare"):
        return False
    try:
        probe = subprocess.run([sys.executable, "-c", "pass"], preexec_fn=lambda: os.unshare(os.CLONE_NEWNET))
        return probe.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limit(limits: SandboxLimits, isolate: bool) -> None:
    """Runs in the child between fork and exec."""
    os.setsid()
    cpu = max(1, int(limits.timeout_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = limits.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.max_file_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    if isolate:
        os.unshare(os.CLONE_NEWNET)


class Sandbox:
    """A temporary directory and the limits code runs under; one per trajectory."""

    def __init__(self, limits: SandboxLimits):
        self.limits = limits
        self.dir = Path(tempfile.mkdtemp(prefix="toolrl-sandbox-"))

    def run(self, code: str) -> tuple[int | None, str]:
        """(exit code, or None on timeout; combined output). Output goes to a file in the directory (so the file
        size limit bounds it too); past `max_output_chars` its head and tail are kept, which keeps a traceback."""
        isolate = network_isolated()
        (self.dir / "main.py").write_text(code, encoding="utf-8")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir), "LANG": "C.UTF-8"}
        output = self.dir / ".output"
        with output.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT.format(isolated=isolate)],
                cwd=self.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                preexec_fn=functools.partial(_limit, self.limits, isolate),
            )
            try:
                status = process.wait(timeout=self.limits.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                status = None
        text = output.read_bytes().decode("utf-8", errors="replace")
        output.unlink()
        cap = self.limits.max_output_chars
        if len(text) > cap:
            head, tail = text[: cap // 2], text[-(cap - cap // 2) :]
            text = f"{head}\n... [{len(text) - cap} characters cut] ...\n{tail}"
        return status, text

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def run_python(code: str, sandbox: Sandbox) -> str:
    """The tool body: output on success; a failed run raises ValueError with the output's tail (the traceback)."""
    status, output = sandbox.run(code)
    if status is None:
        raise ValueError(f"the code ran longer than {sandbox.limits.timeout_s:g} s and was stopped")
    if status != 0:
        if status < 0 and -status == signal.SIGXCPU:
            raise ValueError(f"the code used more than {sandbox.limits.timeout_s:g} s of CPU and was stopped")
        tail = "\n".join(output.strip().splitlines()[-8:])
        raise ValueError(f"the code failed (exit {status}):\n{tail}")
    return output.strip() or "(no output; print the result)"
