"""Reading a file of a run folder as data from anyone: a run folder may come from another machine or user, or be
edited by hand, so a file in it may be a FIFO (an open() that never returns), a device (/dev/zero, endless), a
socket, or a link to a file outside the folder (~/.ssh/id_rsa served as a console log). `open_in_run` opens
without blocking, refuses what is not a regular file, and checks the file it actually opened (its
/proc/self/fd link, so a link swapped between the check and the open is caught) lies inside the run folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO


class UnreadableRunFile(OSError):
    """A run folder's file that is not read: not a regular file, or outside the run folder. The message names
    the file and why, in one line."""


def _opened_path(fd: int, fallback: str) -> str:
    """The path of what `fd` is open on (Linux: /proc/self/fd), else the path resolved before opening."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return fallback


def _check_regular(mode: int, shown: str) -> None:
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise UnreadableRunFile(f"{shown}: {kind}; skipped (a run folder's files are regular files)")


def open_in_run(run: Path, path: Path) -> BinaryIO:
    """`path` (inside the run folder `run`) opened for reading in binary; raises FileNotFoundError when it is
    missing and UnreadableRunFile when it is not a regular file or resolves outside `run` (links included)."""
    root = os.path.realpath(run)
    resolved = os.path.realpath(path)
    shown = os.path.relpath(os.path.abspath(path), os.path.abspath(run))
    if os.path.commonpath([root, resolved]) != root:
        raise UnreadableRunFile(f"{shown}: a link to a file outside the run folder; not read")
    _check_regular(os.stat(resolved).st_mode, shown)  # a socket cannot even be opened
    fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)  # a FIFO opens at once
    try:
        _check_regular(os.fstat(fd).st_mode, shown)  # what was opened, whatever was there a moment ago
        if os.path.commonpath([root, _opened_path(fd, resolved)]) != root:
            raise UnreadableRunFile(f"{shown}: changed into a link out of the run folder while it was opened")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_run_file(run: Path, path: Path, limit: int | None = None) -> bytes:
    """The bytes of `path` in the run folder (at most `limit`), by open_in_run's rules."""
    with open_in_run(run, path) as f:
        return f.read() if limit is None else f.read(limit)


def run_file_problem(run: Path, path: Path) -> str | None:
    """Why `path` would not be read (one line), or None when it is a readable regular file or missing."""
    try:
        open_in_run(run, path).close()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return str(exc) if isinstance(exc, UnreadableRunFile) else f"{path.name}: {exc.strerror}"
    return None
