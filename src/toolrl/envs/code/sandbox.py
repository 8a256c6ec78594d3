"""Run model-written Python in a sandbox that is a boundary, not a guard against accidents.

Isolation (`env.options.isolation`), in order of preference for `auto`:
- bubblewrap (`bwrap`, installed by `make install-test` where the system's package manager allows);
- unshare: util-linux `unshare` and jail.py, the same namespaces and mounts built by hand;
- none: only the limits below, for machines with neither; it must be chosen explicitly (unsafe), and `auto`
  refuses to start the code environment rather than fall back to it.

Inside bubblewrap or unshare, the code sees:
- a root of read-only binds: /usr (and its /bin, /lib links), the Python installation running toolrl (its
  prefix and virtual environment, read-only), /etc/ld.so.cache, minimal /dev, its own /proc;
- its own directory, the only writable place (also HOME and TMPDIR); nothing else of the home or /tmp;
- a network namespace with no interface but loopback: no network through any API (sockets, ctypes, a shell's
  /dev/tcp, another program);
- a PID namespace: when the call ends, every process it started (detached with setsid, orphaned, daemonized)
  is killed with it;
- as an unprivileged user with no capabilities and no-new-privileges (when toolrl runs as root, a user id of
  its own per sandbox, so that its process limit counts only its own processes);
- limits: wall-clock time (the process group is killed), CPU time, address space (memory), file size, open
  files, and processes (RLIMIT_NPROC, set inside the namespaces).
Output goes to a file in the directory (bounded by the file size limit) and is cut to `max_output_chars`
(head and tail kept).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolrl.errors import ConfigError

log = logging.getLogger(__name__)

_BOOT = """
import resource, socket, sys, traceback
if {nproc}:
    resource.setrlimit(resource.RLIMIT_NPROC, ({nproc}, {nproc}))
else:  # no isolation: only Python's own socket module can be closed, which other APIs get around
    def _blocked(*args, **kwargs):
        raise OSError("network access is disabled in this sandbox")
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

JAIL = Path(__file__).with_name("jail.py")
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
    python = [sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parents[1])]
    for path in python:
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in read_only):
            read_only.append(path)
    files = tuple(f for f in ("/etc/ld.so.cache",) if os.path.exists(f))
    return _Layout(tuple(dict.fromkeys(read_only)), links, files)


def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _bubblewrap(directory: str, env: dict[str, str], root: bool) -> list[str]:
    layout = _layout()
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if not root:
        namespaces.append("--unshare-user")  # how an unprivileged user may make the others
    command = ["bwrap", *namespaces, "--die-with-parent", "--new-session"]
    made: set[str] = {"/"}
    for path in (*layout.read_only, *layout.files, directory):
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
    command += ["--proc", "/proc", "--dev", "/dev", "--bind", directory, directory, "--chdir", directory]
    command += ["--clearenv", *[arg for key, value in env.items() for arg in ("--setenv", key, value)]]
    return [*command, "--remount-ro", "/", "--"]


def _unshare(directory: str, env: dict[str, str], root: bool) -> list[str]:
    layout = _layout()
    spec = {
        "root": directory + ".root",  # an empty folder the sandbox makes beside its own, the new root's mount point
        "ro": list(layout.read_only),
        "files": list(layout.files),
        "rw": [directory],
        "links": layout.links,
        "cwd": directory,
        "env": env,
    }
    user = [] if root else ["--user", "--map-root-user"]
    namespaces = ["--mount", "--pid", "--fork", "--net", "--ipc", "--uts", "--kill-child"]
    return ["unshare", *user, *namespaces, "--", sys.executable, "-I", str(JAIL), json.dumps(spec), "--"]


ISOLATIONS: dict[str, Callable[[str, dict[str, str], bool], list[str]]] = {
    "bubblewrap": _bubblewrap,
    "unshare": _unshare,
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


def _limit(limits: SandboxLimits) -> None:
    """Runs in the child between fork and exec."""
    cpu = max(1, int(limits.timeout_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = limits.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.max_file_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


_uids_in_use: set[int] = set()
_uid_lock = threading.Lock()


class Sandbox:
    """A directory and the isolation and limits code runs under; one per trajectory."""

    def __init__(self, limits: SandboxLimits, check: bool = True):
        self.limits = limits
        self.isolation = resolve_isolation(limits.isolation) if check else limits.isolation
        self.dir = Path(tempfile.mkdtemp(prefix="toolrl-sandbox-"))
        if self.isolation == "unshare":
            Path(f"{self.dir}.root").mkdir(mode=0o700)
        self.uid: int | None = None
        if self.isolation != "none" and os.geteuid() == 0:
            with _uid_lock:
                while self.uid is None or self.uid in _uids_in_use:
                    self.uid = random.randrange(*SANDBOX_UIDS)
                _uids_in_use.add(self.uid)
            os.chown(self.dir, self.uid, self.uid)

    def _command(self, env: dict[str, str]) -> list[str]:
        nproc = 0 if self.isolation == "none" else self.limits.max_processes
        boot = [sys.executable, "-I", "-c", _BOOT.format(nproc=nproc)]
        if self.isolation == "none":
            return boot
        root = os.geteuid() == 0
        drop = ["--reuid", str(self.uid), "--regid", str(self.uid), "--clear-groups"] if root else []
        if root or shutil.which("setpriv"):
            drop = ["setpriv", *drop, "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        return [*ISOLATIONS[self.isolation](str(self.dir), env, root), *drop, *boot]

    def run(self, code: str) -> tuple[int | None, str]:
        """(exit code, or None on timeout; combined output). Output goes to a file in the directory (so the file
        size limit bounds it too); past `max_output_chars` its head and tail are kept, which keeps a traceback."""
        main = self.dir / "main.py"
        main.write_text(code, encoding="utf-8")
        home = str(self.dir)
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "PWD": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        output = self.dir / ".output"
        if self.uid is not None:
            os.chown(main, self.uid, self.uid)
        with output.open("wb") as sink:
            process = subprocess.Popen(
                self._command(env),
                cwd=self.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(_limit, self.limits),
            )
            try:
                status = process.wait(timeout=self.limits.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the namespace dies with its parent
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
        shutil.rmtree(f"{self.dir}.root", ignore_errors=True)  # the unshare jail's mount point, empty
        if self.uid is not None:
            with _uid_lock:
                _uids_in_use.discard(self.uid)


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
