"""Run model-written Python in a sandbox that is a boundary, not a guard against accidents.

Isolation (`env.options.isolation`), in order of preference for `auto`:
- bubblewrap (`bwrap`, installed by `make install-test` where the system's package manager allows);
- unshare: util-linux `unshare` and jail.py, the same namespaces and mounts built by hand;
- none: only the limits below, for machines with neither; it must be chosen explicitly (unsafe), and `auto`
  refuses to start the code environment rather than fall back to it.

Inside bubblewrap or unshare, the code sees:
- a root of read-only binds: /usr (and its /bin, /lib links), the Python installation running toolrl (its
  prefix and virtual environment, read-only), /etc/ld.so.cache, minimal /dev, its own /proc;
- its own folder, /sandbox, the only writable place (also HOME and TMPDIR): a tmpfs made for each call and
  capped at `disk_mb`, gone when the call ends; nothing of the host's disk is writable;
- a network namespace with no interface but loopback: no network through any API (sockets, ctypes, a shell's
  /dev/tcp, another program, UDP, DNS, abstract unix sockets);
- a PID namespace: when the call ends, every process it started (detached with setsid, orphaned, daemonized)
  is killed with it;
- as an unprivileged user with no capabilities and no-new-privileges (when toolrl runs as root, a user id of
  its own per sandbox, so that its process limit counts only its own processes);
- limits: wall-clock time (the process group is killed), CPU time, address space (memory), file size, open
  files, and processes and threads (RLIMIT_NPROC, set inside the namespaces).

The host never opens a path inside the sandbox: the program goes in through a pipe (stdin, which the code then
sees as /dev/null) and the output comes back through a pipe, of which at most `max_output_chars` are kept
(head and tail) and at most `max_file_mb` read (past it the program is stopped). Whatever the code leaves in
its folder (symlinks, FIFOs, hard links) is never followed, read or written by the host; one deadline holds
the whole call.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from toolrl.envs.code.exchange import exchange
from toolrl.envs.code.memory import SharedCgroup, memory_bound
from toolrl.envs.code.output import BoundedOutput
from toolrl.errors import ConfigError
from toolrl.tools.limits import ToolFailed

log = logging.getLogger(__name__)

_BOOT = """
import linecache, os, resource, socket, sys, traceback
source = sys.stdin.buffer.read().decode("utf-8")  # the program comes through a pipe, never a file
linecache.cache["main.py"] = (len(source), None, source.splitlines(True), "main.py")  # tracebacks show its lines
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(0, closefd=False)
if {nproc}:
    resource.setrlimit(resource.RLIMIT_NPROC, ({nproc}, {nproc}))
else:  # no isolation: only Python's own socket module can be closed, which other APIs get around
    def _blocked(*args, **kwargs):
        raise OSError("network access is disabled in this sandbox")
    socket.socket.connect = socket.socket.connect_ex = socket.create_connection = _blocked
    socket.getaddrinfo = _blocked
sys.argv = ["main.py"]
try:
    exec(compile(source, "main.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
except SystemExit:
    raise
except BaseException as exc:  # the traceback from the model's own code, without this bootstrap's frame
    try:  # what it printed comes first, as in a terminal (stdout is buffered in a pipe, stderr is not)
        sys.stdout.flush()
    except BaseException:
        pass
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""

WORKDIR = "/sandbox"
"""The code's folder inside bubblewrap and unshare: a tmpfs of `disk_mb`, made for each call."""
JAIL = Path(__file__).with_name("jail.py")
PYTHON = os.path.abspath(sys.executable)
"""The interpreter the code runs on, as a plain path (`bench/../.venv/bin/python` names a folder the sandbox
does not have); not resolved, so that a virtual environment stays one."""
SANDBOX_UIDS = (4_200_000, 5_200_000)
"""When toolrl runs as root, each sandbox runs as a user id drawn from this range (no such user exists)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 2000
    max_file_mb: int = 10
    max_processes: int = 64
    """Processes and threads the code may have at once."""
    isolation: str = "auto"
    """auto, bubblewrap, unshare or none (see the module's docstring)."""
    disk_mb: int = 64
    """Size of the code's writable folder (a tmpfs per call; not enforced without isolation)."""
    memory_bound: str = "auto"
    """How `memory_mb` bounds all the call's processes together: cgroup, watch, or auto (memory.py)."""


@dataclass(frozen=True)
class _Layout:
    """What the sandbox's root is made of."""

    read_only: tuple[str, ...]
    links: dict[str, str]
    files: tuple[str, ...]


@functools.cache
def _layout() -> _Layout:
    read_only, links = ["/usr"], {}
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(top):
            links[top] = os.readlink(top)
        elif os.path.isdir(top):
            read_only.append(top)
    python = [sys.base_prefix, sys.prefix, str(Path(PYTHON).parents[1]), str(Path(PYTHON).resolve().parents[1])]
    for path in python:
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in read_only):
            read_only.append(path)
    files = tuple(f for f in ("/etc/ld.so.cache",) if os.path.exists(f))
    return _Layout(tuple(dict.fromkeys(read_only)), links, files)


def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _bubblewrap(env: dict[str, str], root: bool, disk_bytes: int, binds: dict[str, str], cwd: str) -> list[str]:
    layout = _layout()
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if not root:
        namespaces.append("--unshare-user")  # how an unprivileged user may make the others
    command = ["bwrap", *namespaces, "--die-with-parent", "--new-session"]
    made: set[str] = {"/"}
    for path in (*layout.read_only, *layout.files):
        for parent in _ancestors(path):  # bwrap would make them 0700, closed to the sandbox's user
            if parent not in made and parent not in layout.links:
                command += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        made.add(path)
    for path in layout.read_only:
        command += ["--ro-bind", path, path]
    for path in layout.files:
        command += ["--ro-bind", path, path]
    for link, target in layout.links.items():
        command += ["--symlink", target, link]
    command += ["--proc", "/proc", "--dev", "/dev"]
    command += ["--perms", "01777", "--size", str(disk_bytes), "--tmpfs", WORKDIR]
    for inside, host in binds.items():  # a box's folders (sandbox/local.py): writable, kept between calls
        command += ["--bind", host, inside]
    command += ["--chdir", cwd]
    command += ["--clearenv", *[arg for key, value in env.items() for arg in ("--setenv", key, value)]]
    return [*command, "--remount-ro", "/", "--"]


def _unshare(
    env: dict[str, str], root: bool, disk_bytes: int, mount_point: str, binds: dict[str, str], cwd: str
) -> list[str]:
    layout = _layout()
    spec = {
        "root": mount_point,  # an empty folder of the sandbox's own, the new root's mount point
        "ro": list(layout.read_only),
        "files": list(layout.files),
        "tmpfs": {"path": WORKDIR, "size": disk_bytes},
        "links": layout.links,
        "rw": binds,
        "cwd": cwd,
        "env": env,
    }
    user = [] if root else ["--user", "--map-root-user"]
    namespaces = ["--mount", "--pid", "--fork", "--net", "--ipc", "--uts", "--cgroup", "--kill-child"]
    return ["unshare", *user, *namespaces, "--", PYTHON, "-I", str(JAIL), json.dumps(spec), "--"]


ISOLATIONS: dict[str, Callable[..., list[str]]] = {
    "bubblewrap": lambda env, root, disk, box, cwd: _bubblewrap(env, root, disk, box.binds, cwd),
    "unshare": lambda env, root, disk, box, cwd: _unshare(env, root, disk, str(box.mount_point), box.binds, cwd),
}
"""Isolation name -> the command line that runs a program inside it (before the program's own)."""
_PROGRAMS = {"bubblewrap": "bwrap", "unshare": "unshare"}
_probes: dict[str, str | None] = {}
_probe_lock = threading.Lock()


def _why_unusable(isolation: str) -> str | None:
    """None when `isolation` runs code here, else why not (probed once per process)."""
    with _probe_lock:
        if isolation not in _probes:
            if shutil.which(_PROGRAMS[isolation]) is None:
                _probes[isolation] = f"{_PROGRAMS[isolation]} is not installed"
            else:
                box = Sandbox(SandboxLimits(timeout_s=20, isolation=isolation), check=False)
                try:
                    status, output = box.run("print('ok')")
                    ok = status == 0 and output.strip() == "ok"
                    _probes[isolation] = None if ok else f"{isolation} failed here: {output.strip()[-200:]}"
                finally:
                    box.close()
    return _probes[isolation]


def resolve_isolation(wanted: str) -> str:
    """The isolation to use for `wanted` (auto picks the first that works), or ConfigError saying what to do."""
    if wanted == "none":
        return "none"
    if wanted not in (*ISOLATIONS, "auto"):
        raise ConfigError(f"env.options.isolation: unknown {wanted!r}; known: auto, bubblewrap, unshare, none")
    reasons = []
    for name in ISOLATIONS if wanted == "auto" else (wanted,):
        reason = _why_unusable(name)
        if reason is None:
            return name
        reasons.append(reason)
    raise ConfigError(
        f"env.options.isolation: no sandbox for model code on this machine ({'; '.join(reasons)}); install "
        "bubblewrap (apt install bubblewrap) or, to run model code unisolated, set env.options.isolation: none (unsafe)"
    )


_LAUNCH = """
for procs in "${@:2:$1}"; do
  echo $$ 2>/dev/null > "$procs" || { echo "toolrl sandbox: cannot join the call's cgroup $procs" >&2; exit 126; }
done
shift $(( $1 + 1 ))
{ ulimit -S -t "$2" && ulimit -H -t "$1" && ulimit -v "$3" && ulimit -f "$4" && ulimit -n 64; } || exit 126
shift 4
exec "$@"
"""
"""The host's side of a call before the isolation starts: its cgroup joined and its process limits set, in a bash
that then becomes the call's first program. A Python `preexec_fn` would do the same after a fork of this whole
process (72 ms a call beside a 1.5 GB training heap, against 2.6 ms for this script)."""


def _launcher(limits: SandboxLimits, cgroup_procs: list[str]) -> list[str]:
    """bash running _LAUNCH: joins `cgroup_procs`, then sets CPU time (soft at the timeout, SIGXCPU; hard a second
    later), address space, file size and open files."""
    cpu = max(1, int(limits.timeout_s + 0.999))
    memory_kb, size_kb = limits.memory_mb * 1024, limits.max_file_mb * 1024
    return ["/bin/bash", "-c", _LAUNCH, "launch", str(len(cgroup_procs)), *cgroup_procs,
            str(cpu + 1), str(cpu), str(memory_kb), str(size_kb)]  # fmt: skip


_uids_in_use: set[int] = set()
_uid_lock = threading.Lock()


class Sandbox:
    """The isolation and limits code runs under; one per trajectory. Each call starts in an empty folder.

    `binds` (inside path -> host folder) adds writable folders that outlive a call: a box's (sandbox/local.py),
    made by the host for the sandbox's user; the host reads and writes them only through programs run inside."""

    def __init__(self, limits: SandboxLimits, check: bool = True, binds: Mapping[str, str] | None = None):
        self.limits = limits
        self.isolation = resolve_isolation(limits.isolation) if check else limits.isolation
        self.binds = dict(binds or {})
        if self.binds and self.isolation == "none":
            raise ConfigError("a sandbox with folders of its own needs an isolation (bubblewrap or unshare), not none")
        self.shared = None  # a box's cgroup for all its calls (memory.SharedCgroup; None: one per call)
        if self.binds:
            self.shared = SharedCgroup.make(limits.memory_mb * 2**20, limits.max_processes, limits.memory_bound)
        self.mount_point: Path | None = None
        if self.isolation == "unshare":  # an empty folder only the jail mounts on (in its own mount namespace)
            self.mount_point = Path(tempfile.mkdtemp(prefix="toolrl-jail-"))
        self.uid: int | None = None
        if self.isolation != "none" and os.geteuid() == 0:
            with _uid_lock:
                while self.uid is None or self.uid in _uids_in_use:
                    self.uid = random.randrange(*SANDBOX_UIDS)
                _uids_in_use.add(self.uid)

    def _command(self, env: dict[str, str], argv: list[str], cwd: str) -> list[str]:
        if self.isolation == "none":
            return argv
        root = os.geteuid() == 0
        drop = ["--reuid", str(self.uid), "--regid", str(self.uid), "--clear-groups"] if root else []
        if root or shutil.which("setpriv"):
            drop = ["setpriv", *drop, "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        disk = self.limits.disk_mb * 2**20
        return [*ISOLATIONS[self.isolation](env, root, disk, self, cwd), *drop, *argv]

    def run(self, code: str) -> tuple[int | None, str]:
        """(exit code, -N when signal N killed it, or None on timeout; combined output). The program goes in
        through stdin and the output comes back through a pipe; past `max_output_chars` its head and tail are
        kept, which keeps a traceback, and past `max_file_mb` the program is stopped. Inside an isolation, an exit
        code past 128 reads as a signal, as a shell's does (the code's own `sys.exit(137)` too)."""
        nproc = 0 if self.isolation == "none" else self.limits.max_processes
        boot = [PYTHON, "-I", "-c", _BOOT.format(nproc=nproc)]
        output = BoundedOutput(self.limits.max_output_chars, self.limits.max_file_mb * 2**20)
        status, exceeded = self.exec(boot, code.encode("utf-8", errors="replace"), output)
        text = output.text()
        if exceeded:
            text += f"\n{MEMORY_NOTE.format(mb=self.limits.memory_mb)}"
        return status, text

    def exec(
        self, argv: list[str], stdin: bytes, output, cwd: str = WORKDIR, env: Mapping[str, str] | None = None,
        timeout_s: float | None = None, stderr: bool = True,
    ) -> tuple[int | None, bool]:  # fmt: skip
        """Run `argv` inside: (exit code as `run` gives it, whether the memory bound stopped it). `output` (a
        BoundedOutput or anything with add() and over_limit) takes stdout, and stderr unless `stderr` is False
        (then it is dropped: a tar stream read back). `env` adds to the variables a call starts with."""
        scratch = None if self.isolation != "none" else tempfile.mkdtemp(prefix="toolrl-sandbox-")
        home = scratch or (cwd if self.binds else WORKDIR)
        base = {"PATH": f"{Path(PYTHON).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": home, "PWD": home,
                "TMPDIR": home if not self.binds else "/tmp", "LANG": "C.UTF-8"}  # fmt: skip
        if not self.binds:
            base["PATH"] = "/usr/bin:/bin"
        base.update(env or {})
        limits = self.limits
        bound = (
            self.shared.call()
            if self.shared
            else memory_bound(limits.memory_mb << 20, limits.max_processes, limits.memory_bound)
        )
        try:
            process = subprocess.Popen(
                [*_launcher(limits, bound.procs), *self._command(base, argv, cwd if self.binds else WORKDIR)],
                cwd=scratch or "/",
                env=base,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if stderr else subprocess.DEVNULL,
                start_new_session=True,
            )
            bound.watch(process.pid)
            status = exchange(process, stdin, output, timeout_s or self.limits.timeout_s)
            exceeded = bound.exceeded()
        finally:
            bound.close()
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)  # fd-based: never follows what the code left
        if self.isolation != "none" and status is not None and 128 < status < 128 + signal.NSIG:
            status = 128 - status  # bwrap's and the jail's init report a signal as a shell does; Popen's sign
        return status, exceeded

    def close(self) -> None:
        if self.shared is not None:
            self.shared.release()
            self.shared = None
        if self.mount_point is not None:
            shutil.rmtree(self.mount_point, ignore_errors=True)
            self.mount_point = None
        if self.uid is not None:
            with _uid_lock:
                _uids_in_use.discard(self.uid)
            self.uid = None


TRACEBACK_LINES = 24
"""The last lines of a failed run's output the model reads: its traceback as Python prints it (the frames that led
there, the exception's type and message), and what it printed before."""


MEMORY_NOTE = "[the code's processes together used more than {mb} MB of memory: it was stopped]"


def how_it_ended(status: int) -> str:
    """ "failed (exit 3)" or "was killed by SIGSEGV", for a nonzero status from `Sandbox.run`."""
    if status >= 0:
        return f"failed (exit {status})"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:  # a real-time signal
        return f"was killed by signal {-status}"


def run_python(code: str, sandbox: Sandbox) -> str:
    """The tool body: output on success; a failed run raises ToolFailed with its exit code and the tail of its
    output and stderr (the traceback, as a Python user sees it), bounded."""
    status, output = sandbox.run(code)
    memory = MEMORY_NOTE.format(mb=sandbox.limits.memory_mb)
    if memory in output:
        tail = "\n".join(output.replace(memory, "").strip().splitlines()[-TRACEBACK_LINES:])
        raise ToolFailed(f"the code used more than {sandbox.limits.memory_mb} MB of memory (all its processes "
                         f"together) and was stopped (exit {status}):\n{tail}".rstrip())  # fmt: skip
    if status is None:
        raise ToolFailed(f"the code ran longer than {sandbox.limits.timeout_s:g} s and was stopped")
    if status != 0:
        if status < 0 and -status == signal.SIGXCPU:
            raise ToolFailed(f"the code used more than {sandbox.limits.timeout_s:g} s of CPU and was stopped")
        if status < 0 and -status == signal.SIGXFSZ:
            raise ToolFailed(f"the code wrote past its limits and was stopped:\n{output.strip()[-300:]}")
        tail = "".join(f"\n{line}" for line in output.strip().splitlines()[-TRACEBACK_LINES:])
        raise ToolFailed(f"the code {how_it_ended(status)}{':' if tail else ''}{tail}")
    return output.strip() or "(no output; print the result)"
