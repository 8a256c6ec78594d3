"""Escape attempts against the code sandbox, each checked from outside: did the program reach what it should
not? Used by the tests and by `bench/sandbox_probe.py`; run them on a new machine before training with the
code environment (`python bench/sandbox_probe.py`).

Each attempt is a program the model could write and a check on the host after it ran: a secret file in the
user's home, /etc/passwd, files written outside the sandbox's folder, a TCP listener on the host (reached with
sockets, the `_socket` module, bash's /dev/tcp, another program, ctypes), processes left running after the
call (setsid, a double fork), a host process killed or its environment read, and the limits (processes,
memory, file size).
"""

from __future__ import annotations

import contextlib
import os
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

    def close(self) -> None:
        for pid in self.leftovers():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.victim.kill()
        self.victim.wait()
        self.listener.close()
        self.secret.unlink(missing_ok=True)


def _outside_paths(host: _Host) -> list[str]:
    """Places a sandbox must not write: beside its folder, /tmp, the home, the Python installation, here."""
    name = f"toolrl-escape-{host.token}"
    places = [tempfile.gettempdir(), "/tmp", str(Path.home()), sys.prefix, os.getcwd()]
    return [str(Path(place) / name) for place in dict.fromkeys(places)]


def _attempts(host: _Host, limits: SandboxLimits) -> list[tuple[str, str, Callable[[str], tuple[bool, str]]]]:
    """(name, program, check(output) -> (escaped, detail))."""
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

    def forked(output: str) -> tuple[bool, str]:
        counts = [int(w) for w in output.split() if w.isdigit()]
        return (not counts or counts[-1] >= limit), output.strip()[-200:]

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
            "write past the file size limit",
            "open('big', 'wb').write(b'0' * (64 * 2**20))\nprint('wrote', __import__('os').path.getsize('big'))",
            printed("wrote 67108864"),
        ),
    ]


def probe(isolation: str, timeout_s: float = 5.0) -> list[Attempt]:
    """Run every escape attempt in a fresh sandbox of `isolation`; each result says whether it escaped."""
    host = _Host()
    results = []
    try:
        limits = SandboxLimits(timeout_s=timeout_s, memory_mb=512, max_file_mb=10, isolation=isolation)
        for name, program, check in _attempts(host, limits):
            if isolation == "none" and name == "fork past the process limit":
                results.append(Attempt(name, True, "not run: without isolation nothing limits it (as root)"))
                continue
            sandbox = Sandbox(limits)
            host.hits_before = len(host.hits)
            try:
                _, output = sandbox.run(program)
                escaped, detail = check(output)
            finally:
                sandbox.close()
            results.append(Attempt(name, escaped, detail))
            for pid in host.leftovers():  # a leak must not count against the next attempt
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        host.close()
    return results
