"""A sandboxed program's pipes, within one deadline: its input written, its output read, killed past either."""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import time

from toolrl.envs.code.output import BoundedOutput

log = logging.getLogger(__name__)

_DRAIN_S = 0.2
"""After the program's first process ends, how long the host goes on reading what is left in the pipe."""
_GRACE_S = 1.0
"""After the deadline, how long the host waits for a killed sandbox's process to end before giving up on it."""


def exchange(process: subprocess.Popen, program: bytes, output: BoundedOutput, timeout_s: float) -> int | None:
    """Feed `program` to stdin and read stdout into `output` until the process ends, all within one deadline;
    past it (or past the output limit) kill the process group. None when the deadline stopped it."""
    deadline = time.monotonic() + timeout_s
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None and stdout is not None
    os.set_blocking(stdin.fileno(), False)
    pending = memoryview(program)
    stopped = False
    with selectors.DefaultSelector() as selector:
        selector.register(stdout, selectors.EVENT_READ)
        selector.register(stdin, selectors.EVENT_WRITE)
        ended_at = None
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline or output.over_limit:
                stopped = True
                break
            if ended_at is None and process.poll() is not None:
                ended_at = now
            if ended_at is not None and now - ended_at > _DRAIN_S:
                break  # the program ended; what it left behind (without isolation) may hold the pipe open
            for key, _ in selector.select(timeout=min(deadline - now, 0.1)):
                if key.fileobj is stdin:
                    try:
                        pending = pending[os.write(stdin.fileno(), pending[:65536]) :]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(stdin)
                        stdin.close()
                else:
                    chunk = os.read(stdout.fileno(), 65536)
                    if chunk:
                        output.add(chunk)
                    else:
                        selector.unregister(stdout)
    status = None
    if not stopped:
        try:
            status = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stopped = True
    if stopped:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the namespace dies with its first process
        try:
            process.wait(timeout=_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("sandbox process %d did not end %.0f s after SIGKILL; leaving it", process.pid, _GRACE_S)
        status = -signal.SIGXFSZ if output.over_limit else None
    for stream in (stdin, stdout):
        with contextlib.suppress(OSError):
            stream.close()
    return status
