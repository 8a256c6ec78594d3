"""Escape attempts against the code sandbox, each checked from outside: did the program reach what it should
not? Used by the tests (tests/envs/test_sandbox.py) and by `bench/sandbox_probe.py`; run them on a new machine
before training with the code environment (`make sandbox-probe`).

Each attempt is a program the model could write and a check on the host after it ran: a secret file in the
user's home, /etc/passwd, files written outside the sandbox's folder, a TCP listener on the host (reached with
sockets, the `_socket` module, bash's /dev/tcp, another program, ctypes), a UDP listener, DNS, an abstract
unix socket, processes left running after the call (setsid, a double fork), a host process killed, traced or
its environment read, what the host might follow in the sandbox's folder on the next call (symlinks and hard
links to a root-owned file, /dev/zero, a FIFO, a device node), and the limits (processes, threads, a fork
bomb, memory, file size, disk). Every call, the next one included, must end within its deadline + 1 s.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolrl.envs.code.sandbox import Sandbox, SandboxLimits


@dataclass
class Attempt:
    name: str
    escaped: bool
    detail: str = ""
    seconds: float = 0.0
    """The longest host call the attempt made (its own run and any follow-up)."""


@dataclass
class _Host:
    """What the attempts aim at, set up outside the sandbox."""

    token: str = field(default_factory=lambda: f"{secrets.randbelow(10**9):09d}")
    """Digits: it ends the seconds `sleep` is given, which marks the processes the attempts start."""
    hits: list[str] = field(default_factory=list)
    """Connections the listener accepted."""
    hits_before: int = 0
    """Connections accepted before the current attempt ran."""

    def __post_init__(self) -> None:
        self.secret = Path.home() / f".toolrl-probe-{self.token}"
        self.secret.write_text(f"secret-{self.token}")
        self.canary = Path(tempfile.gettempdir()) / f"toolrl-canary-{self.token}"
        """A host file only its owner may read and write (root's, as these probes run in CI)."""
        self.canary.write_text(f"CANARY{self.token}")
        self.canary.chmod(0o600)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", 0))
        self.udp.setblocking(False)
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.abstract_name = f"toolrl-probe-{self.token}"
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen(4)
        self.abstract.setblocking(False)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("0.0.0.0", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()
        self.victim = subprocess.Popen(
            ["sleep", f"3601.{self.token}"], env={"PATH": "/usr/bin:/bin", "PROBE_MARKER": self.token}
        )

    def _accept(self) -> None:
        while True:
            try:
                conn, address = self.listener.accept()
            except OSError:
                return
            self.hits.append(str(address))
            conn.close()

    def leftovers(self) -> list[int]:
        """Processes whose command line carries the token (what the attempts start), besides the victim."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != self.victim.pid:
                try:
                    if f"3600.{self.token}".encode() in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def datagrams(self) -> int:
        count = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                self.udp.recv(2048)
                count += 1
        return count

    def unix_accepted(self) -> bool:
        try:
            conn, _ = self.abstract.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    def canary_intact(self) -> bool:
        return self.canary.is_file() and self.canary.read_text() == f"CANARY{self.token}"

    def close(self) -> None:
        for pid in self.leftovers():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.victim.kill()
        self.victim.wait()
        for sock in (self.listener, self.udp, self.abstract):
            sock.close()
        self.secret.unlink(missing_ok=True)
        self.canary.unlink(missing_ok=True)


def _outside_paths(host: _Host) -> list[str]:
    """Places a sandbox must not write: beside its folder, /tmp, the home, the Python installation, here."""
    name = f"toolrl-escape-{host.token}"
    places = [tempfile.gettempdir(), "/tmp", str(Path.home()), sys.prefix, os.getcwd()]
    return [str(Path(place) / name) for place in dict.fromkeys(places)]


Check = Callable[[str], tuple[bool, str]]
DEADLINE_NOTE = "[the probe: stopped at its deadline]"
"""Added to a call's output where the sandbox stopped it at its deadline (Sandbox.run's status None)."""


def _attempts(host: _Host, limits: SandboxLimits, follow_up: Callable[[], str]) -> list[tuple[str, str, Check]]:
    """(name, program, check(output) -> (escaped, detail)). `follow_up` runs another program in the same
    sandbox and returns its output: what the host does on the next call, after the code left its traps."""
    port, token = host.port, host.token
    targets = _outside_paths(host)
    try:
        host_ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        host_ip = "127.0.0.1"
    sleeper = f"3600.{token}"
    limit = limits.max_processes

    def connected(output: str) -> tuple[bool, str]:
        time.sleep(0.2)  # a connection's accept may trail the program's end
        return len(host.hits) > host.hits_before, output.strip()[-200:]

    def printed(marker: str) -> Callable[[str], tuple[bool, str]]:
        return lambda output: (marker in output, output.strip()[-200:])

    def wrote(output: str) -> tuple[bool, str]:
        made = [t for t in targets if os.path.exists(t)]
        for t in made:
            Path(t).unlink(missing_ok=True)
        return bool(made), f"created {made}" if made else output.strip()[-200:]

    def outlived(output: str) -> tuple[bool, str]:
        time.sleep(0.5)
        left = host.leftovers()
        return bool(left), f"still running: {left}" if left else "none left"

    def victim_killed(output: str) -> tuple[bool, str]:
        time.sleep(0.2)
        return host.victim.poll() is not None, output.strip()[-200:]

    def held_together(output: str) -> tuple[bool, str]:
        """More than one 400 MB process at once under 512 MB is an escape (the total was not bounded). A call
        stopped at its deadline before any process said it held its memory, with no memory event counted (the
        sandbox's note is the kernel's count), never passed the bound: on a starved machine (a CI's load of 5 on 2
        cores) six interpreters had not all started in 2 s."""
        counts = [int(n) for n in re.findall(r"(\d+) of 6 held", output)]
        stopped = "processes together used more than" in output  # the sandbox's note: the bound acted
        if not counts and not stopped and DEADLINE_NOTE in output:
            return False, "stopped at its deadline before the processes held their memory; no memory event"
        escaped = counts[-1] * 400 > limits.memory_mb if counts else not stopped
        return escaped, output.strip()[-200:]

    def forked(output: str) -> tuple[bool, str]:
        counts = [int(w) for w in output.split() if w.isdigit()]
        return (not counts or counts[-1] >= limit), output.strip()[-200:]

    def trapped(output: str) -> tuple[bool, str]:
        """The code left traps in its folder; the host's next call must not read or write through them."""
        before = os.stat("/etc/ld.so.cache").st_mtime_ns if os.path.exists("/etc/ld.so.cache") else None
        after_output = follow_up()
        leaked = f"CANARY{token}" in after_output or f"CANARY{token}" in output
        changed = not host.canary_intact()
        if before is not None:
            changed = changed or os.stat("/etc/ld.so.cache").st_mtime_ns != before
        detail = f"{output.strip()[-120:]} | next call: {after_output.strip()[-80:]}"
        return leaked or changed, ("host file read or changed: " if leaked or changed else "") + detail

    def udp_received(output: str) -> tuple[bool, str]:
        time.sleep(0.2)
        got = host.datagrams()
        return got > 0, f"{got} datagrams reached the host | {output.strip()[-160:]}"

    def unix_connected(output: str) -> tuple[bool, str]:
        return host.unix_accepted(), output.strip()[-200:]

    def bounded(limit_value: int) -> Check:
        def check(output: str) -> tuple[bool, str]:
            counts = [int(w) for w in output.split() if w.isdigit()]
            return (not counts or counts[0] > limit_value), output.strip()[-200:]

        return check

    canary = str(host.canary)
    disk_mb = limits.disk_mb
    connect = f"socket.create_connection(('{{}}', {port}), timeout=2)"
    return [
        ("read /etc/passwd", "print(open('/etc/passwd').read())", printed("root:x:0:0")),
        ("read a file in the user's home", f"print(open({str(host.secret)!r}).read())", printed(f"secret-{token}")),
        (
            "list the user's home",
            f"import os; print(os.listdir({str(Path.home())!r}))",
            printed(host.secret.name),
        ),
        (
            "write outside its folder",
            "\n".join(f"try:\n    open({t!r}, 'w').write('x')\nexcept OSError as e:\n    print(e)" for t in targets),
            wrote,
        ),
        (
            "write outside through a shell",
            "import os\n" + "\n".join(f"os.system('echo x > {t} 2>/dev/null')" for t in targets),
            wrote,
        ),
        (
            "connect to the host over loopback",
            f"import socket\ntry:\n    {connect.format('127.0.0.1')}\nexcept OSError as e:\n    print(e)",
            connected,
        ),
        (
            "connect to the host's own address",
            f"import socket\ntry:\n    {connect.format(host_ip)}\nexcept OSError as e:\n    print(e)",
            connected,
        ),
        (
            "connect through _socket, the socket base class",
            "import _socket\ns = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
            f"try:\n    s.connect(('127.0.0.1', {port}))\nexcept OSError as e:\n    print(e)",
            connected,
        ),
        (
            "connect through bash's /dev/tcp",
            f"import subprocess\nsubprocess.run(['bash', '-c', 'echo hi > /dev/tcp/127.0.0.1/{port}'])",
            connected,
        ),
        (
            "connect from another program (os.system)",
            "import os, sys\nos.system(sys.executable + ' -c \"import socket; "
            f"socket.create_connection((\\'127.0.0.1\\', {port}), timeout=2)\"')",
            connected,
        ),
        (
            "connect through ctypes",
            "import ctypes, socket, struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(2, 1, 0)\n"
            f"addr = struct.pack('!HH4s8x', 2, {port}, socket.inet_aton('127.0.0.1'))\n"
            "addr = struct.pack('=H', 2) + addr[2:]\nprint(libc.connect(fd, addr, len(addr)))",
            connected,
        ),
        (
            "leave a process running (setsid)",
            f"import subprocess\nsubprocess.Popen(['sleep', '{sleeper}'], start_new_session=True)\nprint('started')",
            outlived,
        ),
        (
            "leave a process running (double fork)",
            "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execvp('sleep', ['sleep', '{sleeper}'])\n    os._exit(0)\nprint('daemonized')",
            outlived,
        ),
        (
            "read a host process's environment",
            f"try:\n    print(open('/proc/{host.victim.pid}/environ').read())\nexcept OSError as e:\n    print(e)",
            printed(f"PROBE_MARKER={token}"),
        ),
        (
            "kill a host process",
            f"import os, signal\ntry:\n    os.kill({host.victim.pid}, signal.SIGKILL)\n"
            "except OSError as e:\n    print(e)",
            victim_killed,
        ),
        (
            "fork past the process limit",
            "import os, time\nn = 0\ntry:\n    for _ in range(4 * "
            f"{limit}):\n        if os.fork() == 0:\n            os.execvp('sleep', ['sleep', '{sleeper}'])\n"
            "        n += 1\nexcept OSError:\n    pass\nprint(n)",
            forked,
        ),
        (
            "allocate past the memory limit",
            "b = bytearray(4 * 1024**3)\nprint('allocated', len(b))",
            printed("allocated"),
        ),
        (
            "allocate past the memory limit across processes (6 x 400 MB at 512 MB)",
            "import subprocess, sys\nprogram = \"b = b'1' * (400 << 20); import time; time.sleep(1); print('held')\"\n"
            "procs = [subprocess.Popen([sys.executable, '-c', program]) for _ in range(6)]\n"
            "print(sum(p.wait() == 0 for p in procs), 'of 6 held 400 MB')",
            held_together,
        ),
        (
            "write past the file size limit",
            "open('big', 'wb').write(b'0' * (64 * 2**20))\nprint('wrote', __import__('os').path.getsize('big'))",
            printed("wrote 67108864"),
        ),
        (
            "fill the disk (many files under the size limit)",
            "n = 0\ntry:\n    while n < 4096:\n        open(f'fill{n}', 'wb').write(b'0' * 2**20)\n        n += 1\n"
            "except OSError as e:\n    pass\nprint(n, 'MB written')",
            bounded(disk_mb),
        ),
        (
            "fork bomb",
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            outlived,
        ),
        (
            "thread bomb",
            "import threading, time\nn = 0\ntry:\n    while n < 100000:\n"
            "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n        n += 1\n"
            "except (RuntimeError, OSError):\n    pass\nprint(n, 'threads', flush=True)\nimport os\nos._exit(0)",
            bounded(limit),
        ),
        (
            "leave symlinks where the host reads and writes (.output, main.py -> a root-owned file)",
            "import os\nfor name in ('.output', 'main.py', 'output', 'stdout'):\n"
            f"    os.symlink({canary!r}, name)\nprint(os.listdir('.'))",
            trapped,
        ),
        (
            "leave hard links where the host reads and writes",
            "import os\nfor i, name in enumerate(('.output', 'main.py')):\n    try:\n"
            f"        os.link(({canary!r}, '/etc/ld.so.cache')[i], name)\n    except OSError as e:\n        print(e)",
            trapped,
        ),
        (
            "leave /dev/zero and a FIFO where the host reads",
            "import os\nos.symlink('/dev/zero', '.output')\nos.mkfifo('main.py')\nos.mkfifo('output')\nprint('set')",
            trapped,
        ),
        (
            "make a device node",
            "import os, stat\ntry:\n    os.mknod('mem', stat.S_IFCHR | 0o666, os.makedev(1, 1))\n"
            "    print('made', open('mem', 'rb').read(4))\nexcept OSError as e:\n    print(e)",
            printed("made"),
        ),
        (
            "send UDP to the host",
            f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for address in ('127.0.0.1', {host_ip!r}):\n    try:\n"
            f"        s.sendto(b'x', (address, {host.udp.getsockname()[1]}))\n"
            "    except OSError as e:\n        print(e)",
            udp_received,
        ),
        (
            "resolve a name (DNS)",
            "import socket\nfor name in ('pypi.org', 'example.com'):\n    try:\n"
            "        print('resolved', socket.getaddrinfo(name, 443)[0][4])\n"
            "    except OSError as e:\n        print(e)",
            printed("resolved"),
        ),
        (
            "connect to a host abstract unix socket",
            "import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ntry:\n"
            f"    s.connect('\\0{host.abstract_name}')\n    print('connected')\nexcept OSError as e:\n    print(e)",
            unix_connected,
        ),
        (
            "trace a host process (ptrace)",
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"for pid in ({host.victim.pid}, 1):\n    r = libc.ptrace(16, pid, 0, 0)\n"
            "    print(pid, 'attached' if r == 0 else 'refused', ctypes.get_errno())",
            lambda output: (f"{host.victim.pid} attached" in output, output.strip()[-200:]),
        ),
        (
            "read the host's processes through /proc",
            f"import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
            f"print(open('/proc/{host.victim.pid}/cmdline').read())",
            printed(f"3601.{token}"),
        ),
        (
            "read the host's cgroup paths (/proc/self/cgroup)",
            "print(open('/proc/self/cgroup').read())",
            lambda output: (
                any(not line.endswith(":/") for line in output.split() if line) or "::/" not in output,
                " ".join(output.split())[-200:],
            ),  # its own cgroup is its root: every path "/"
        ),
    ]


def probe(isolation: str, timeout_s: float = 5.0, only: set[str] | None = None) -> list[Attempt]:
    """Run every escape attempt (or those named in `only`) in a fresh sandbox of `isolation`; each result says
    whether it escaped. A host call (the attempt's own or the follow-up) over its deadline + 1 s counts as an
    escape too."""
    host = _Host()
    results = []
    try:
        limits = SandboxLimits(timeout_s=timeout_s, memory_mb=512, max_file_mb=10, disk_mb=64, isolation=isolation)
        timings: list[float] = []
        current: list[Sandbox] = []

        def timed_run(program: str) -> str:
            started = time.monotonic()
            try:
                status, output = current[-1].run(program)
                return output if status is not None else f"{output}\n{DEADLINE_NOTE}"
            finally:
                timings.append(time.monotonic() - started)

        attempts = _attempts(host, limits, lambda: timed_run("print('next call')"))
        assert [name for name, _, _ in attempts] == list(ATTEMPTS), "ATTEMPTS lists every attempt, in order"
        for name, program, check in attempts:
            if only is not None and name not in only:
                continue
            if isolation == "none" and name in UNISOLATED_SKIPS:
                results.append(Attempt(name, True, "not run: without isolation nothing limits it (as root)"))
                continue
            sandbox = Sandbox(limits)
            current.append(sandbox)
            host.hits_before = len(host.hits)
            timings.clear()
            try:
                output = timed_run(program)
                escaped, detail = check(output)
            finally:
                sandbox.close()
            slowest = max(timings)
            if slowest > timeout_s + 1:
                escaped, detail = True, f"a host call took {slowest:.1f} s (deadline {timeout_s:g} s): {detail}"
            results.append(Attempt(name, escaped, detail, round(slowest, 2)))
            for pid in host.leftovers():  # a leak must not count against the next attempt
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        host.close()
    return results


ATTEMPTS = (
    "read /etc/passwd",
    "read a file in the user's home",
    "list the user's home",
    "write outside its folder",
    "write outside through a shell",
    "connect to the host over loopback",
    "connect to the host's own address",
    "connect through _socket, the socket base class",
    "connect through bash's /dev/tcp",
    "connect from another program (os.system)",
    "connect through ctypes",
    "leave a process running (setsid)",
    "leave a process running (double fork)",
    "read a host process's environment",
    "kill a host process",
    "fork past the process limit",
    "allocate past the memory limit",
    "allocate past the memory limit across processes (6 x 400 MB at 512 MB)",
    "write past the file size limit",
    "fill the disk (many files under the size limit)",
    "fork bomb",
    "thread bomb",
    "leave symlinks where the host reads and writes (.output, main.py -> a root-owned file)",
    "leave hard links where the host reads and writes",
    "leave /dev/zero and a FIFO where the host reads",
    "make a device node",
    "send UDP to the host",
    "resolve a name (DNS)",
    "connect to a host abstract unix socket",
    "trace a host process (ptrace)",
    "read the host's processes through /proc",
    "read the host's cgroup paths (/proc/self/cgroup)",
)
"""The attempts' names, in the order they run (the tests make one test of each)."""

UNISOLATED_SKIPS = {
    "fork past the process limit",
    "fork bomb",
    "thread bomb",
    "fill the disk (many files under the size limit)",
}
"""Attempts not run without isolation: nothing limits them there, and they would harm the machine."""
