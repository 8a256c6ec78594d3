"""The `unshare` fallback of the code sandbox, for machines without bubblewrap: run inside fresh mount, PID,
network, IPC and UTS namespaces (made by util-linux `unshare`), build a root of read-only binds on a tmpfs,
pivot into it, detach the old root, then run the command as the child of an init that stays (see `supervise`).

    unshare [--user --map-root-user] --mount --pid --fork --net --ipc --uts --cgroup --kill-child -- \
        python -I jail.py SPEC_JSON -- COMMAND...

SPEC_JSON: {"root": mount point, "ro": [paths bound read-only], "tmpfs": {"path": "/sandbox", "size": bytes}
(the only writable place, world-writable with the sticky bit), "links": {"/bin": "usr/bin"},
"files": ["/etc/ld.so.cache"], "rw": {inside path: host folder} (writable binds), "cwd": ..., "env": {...}}.
Only the standard library: it runs before anything else is visible.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_PRIVATE = 1 << 18
LOCKED = MS_NOSUID | MS_NODEV | MS_NOEXEC
"""Flags a bind mount in a user namespace must keep from its source (statvfs reports them with the same bits)."""
MNT_DETACH = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def bind(root: str, path: str, writable: bool, source: str | None = None) -> None:
    """Bind `source` (default: the same path on the host) at `path` inside the new root."""
    target, path = root + path, source or path
    if os.path.isdir(path):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        open(target, "a").close()  # a mount point for a file
    mount(path, target, None, MS_BIND | MS_REC)
    kept = os.statvfs(path).f_flag & LOCKED
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | kept | (0 if writable else MS_RDONLY)
    mount(None, target, None, flags)


def build(root: str, spec: dict) -> None:
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for path in spec.get("ro", []) + spec.get("files", []):
        if os.path.exists(path):
            bind(root, path, writable=False)
    if "tmpfs" in spec:
        work = root + spec["tmpfs"]["path"]
        os.makedirs(work, mode=0o755, exist_ok=True)
        mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={int(spec['tmpfs']['size'])}")
    for inside, host in spec.get("rw", {}).items():  # a box's folders, kept between calls
        bind(root, inside, writable=True, source=host)
    for link, target in spec.get("links", {}).items():
        os.symlink(target, root + link)
    os.makedirs(root + "/dev", mode=0o755, exist_ok=True)
    for name in DEVICES:
        bind(root, f"/dev/{name}", writable=True)
    os.makedirs(root + "/proc", mode=0o555, exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV)  # this PID namespace's processes only
    os.makedirs(root + "/.old", mode=0o700)
    number = PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"the unshare sandbox does not know pivot_root on {platform.machine()}; install bubblewrap")
    os.chdir(root)
    _check(_libc.syscall(number, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount the old root")
    os.rmdir("/.old")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def main() -> None:
    spec = json.loads(sys.argv[1])
    command = sys.argv[sys.argv.index("--") + 1 :]
    root = spec["root"]
    try:
        build(root, spec)
    except OSError as exc:
        sys.stderr.write(f"toolrl sandbox: cannot build the jail: {exc}\n")
        os._exit(125)
    os.chdir(spec["cwd"])
    supervise(command, spec["env"])


def supervise(command: list[str], env: dict[str, str]) -> None:
    """Stay as the PID namespace's init, as bubblewrap's is: run the command as a child, reap every orphan, and
    exit as bwrap does, with the command's exit code or 128 + the signal that killed it. A namespace's init
    ignores each signal it has no handler for (SIGXCPU from RLIMIT_CPU, a SIGTERM the code sends itself), so the
    command must not be it; when this init ends, the kernel kills what is left in the namespace."""
    child = os.fork()
    if child == 0:
        try:
            os.execvpe(command[0], command, env)  # PATH from the given environment
        finally:
            os._exit(127)
    while True:
        pid, status = os.wait()
        if pid == child:
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
