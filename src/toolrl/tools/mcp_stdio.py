"""MCP servers over stdio: the server's process, started in its own process group with its stderr in a log
file, and our own stdio transport (the SDK's yields the process, which we need to tell a start-up failure
from a crash). The session handling shared with the HTTP transports is in mcp.py."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import struct
import termios
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from toolrl.text import one_line
from toolrl.tools.mcp import CALL_TAG, STDERR_TAIL_LINES, STOP_GRACE_S, MCPServerConnection


class MCPStdioServer(MCPServerConnection):
    """A server started as a subprocess and spoken to over stdin/stdout; its stderr goes to `log_path` (or is
    discarded when None), and its last lines explain a failure."""

    def __init__(
        self,
        name: str,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        connect_timeout_s: float = 30.0,
        log_path: str | Path | None = None,
        spare: bool | int = False,
    ):
        self.command, self.args, self.cwd = command, list(args), cwd
        self.env = dict(env) if env else None
        self.log_path = Path(log_path) if log_path else None
        self._log_starts: dict[int, int] = {}
        """Where each server process's stderr starts in the log (a spare shares the file)."""
        super().__init__(name, connect_timeout_s)
        self.spares = int(spare)  # true: one

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any, Any | None]:
        from mcp.client.stdio import get_default_environment

        log_file = stack.enter_context(self._stderr_log())
        start = log_file.tell() if self.log_path is not None else 0
        environment = get_default_environment() | (self.env or {})
        opened = await stack.enter_async_context(
            stdio_transport([self.command, *self.args], environment, self.cwd, log_file)
        )
        self._log_starts[opened[2].pid] = start
        return opened

    def _stderr_log(self):
        if self.log_path is None:
            return open(os.devnull, "wb")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.log_path, "ab")  # noqa: SIM115
        handle.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.command}\n".encode())
        handle.flush()
        return handle

    def _describe_exit(self, process: Any | None) -> str:
        if process is None or process.returncode is None:
            return ""
        code = process.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        tail = self.stderr_tail(self._log_starts.get(process.pid, 0))
        return f" ({how}{'; stderr: ' + tail if tail else ''})"

    def stderr_tail(self, start: int | None = None) -> str:
        """The last lines written to the stderr log since `start` (by default the last server started), as
        one bounded line ('' when not logged)."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        if start is None:
            start = max(self._log_starts.values(), default=0)
        with open(self.log_path, "rb") as f:
            f.seek(max(start, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()[-STDERR_TAIL_LINES:]
        return one_line("\n".join(lines), 400)


class Delivery:
    """What became of the tagged requests of one stdio session: where each one ends in the bytes written to the
    server's stdin, and, once the server is gone, how many of those bytes it read. A request the server never
    read was never run, whatever else the crash took with it: it can go to the restarted server."""

    def __init__(self, fd: int):
        self.fd = fd
        self.written = 0
        self.ends: dict[str, int] = {}
        self.read_up_to: int | None = None
        self.settled = asyncio.Event()

    def wrote(self, tag: str | None, size: int) -> None:
        self.written += size
        if tag is not None:
            self.ends[tag] = self.written

    def settle(self) -> None:
        """The server is gone (or its stdin is): count what it left unread in the pipe (FIONREAD works on the
        write end after the reader has died). Once only, before the pipe is closed."""
        if self.settled.is_set():
            return
        try:
            unread = struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            self.read_up_to = self.written - unread
        except OSError:
            self.read_up_to = None  # unknown: every written request may have been read
        self.settled.set()

    def reached(self, tag: str) -> bool:
        """Whether the server may have read request `tag` (True when that cannot be told apart)."""
        end = self.ends.get(tag)
        if end is None:
            return False  # never written
        return self.read_up_to is None or end <= self.read_up_to


def _tag(message: Any) -> str | None:
    params = getattr(message, "params", None)
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(CALL_TAG) if isinstance(meta, dict) else None


@asynccontextmanager
async def stdio_transport(argv: list[str], env: dict[str, str], cwd: str | None, stderr: Any):
    """Newline-delimited JSON-RPC over a subprocess's stdin/stdout, as the SDK's `stdio_client`, but yielding
    the process (its exit code explains a failure, its process group is what close() kills) and a `Delivery`
    (which requests the server read before it died). stdin is our own non-blocking pipe, so that its unread
    bytes can be counted; stdout is split into lines as bytes, in linear time whatever a line's size."""
    import anyio
    from mcp.shared.message import SessionMessage
    from mcp.types import jsonrpc_message_adapter

    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)
        process = await anyio.open_process(
            argv, stdin=read_end, env=env, cwd=cwd, stderr=stderr, start_new_session=True
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    delivery = Delivery(write_end)
    to_session, read_stream = anyio.create_memory_object_stream(0)
    write_stream, from_session = anyio.create_memory_object_stream(0)

    async def read_stdout() -> None:
        pieces: list[bytes] = []
        async with to_session:
            try:
                async for chunk in process.stdout:
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:
                        line = b"".join([*pieces, chunk[start:end]]) if pieces else chunk[start:end]
                        pieces, start = [], end + 1
                        if not line.strip():
                            continue
                        try:
                            message: Any = SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
                        except ValueError as exc:
                            message = exc  # the session reports a malformed line
                        await to_session.send(message)
                    if start < len(chunk):
                        pieces.append(chunk[start:])
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass
            delivery.settle()  # the server closed its stdout: it has exited, or is as good as gone

    async def write_stdin() -> None:
        async with from_session:
            try:
                async for message in from_session:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    data = memoryview((text + "\n").encode("utf-8", "surrogatepass"))
                    sent = 0
                    while sent < len(data):
                        try:
                            sent += os.write(write_end, data[sent:])
                        except BlockingIOError:
                            await anyio.wait_writable(write_end)
                    delivery.wrote(_tag(message.message), len(data))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                delivery.settle()
                await to_session.aclose()  # the session sees the connection end, not a hung request

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(write_stdin)
        try:
            yield read_stream, write_stream, process, delivery
        finally:
            with anyio.CancelScope(shield=True):
                await _stop_process(process, delivery)
            tasks.cancel_scope.cancel()


async def _stop_process(process: Any, delivery: Delivery) -> None:
    """Close stdin; SIGTERM the process group after a grace period, SIGKILL after another. Whatever the server
    started in its group is killed with it."""
    import anyio

    delivery.settle()
    anyio.notify_closing(delivery.fd)  # a writer waiting on the pipe gets ClosedResourceError
    with suppress(OSError):
        os.close(delivery.fd)
    for sig in (signal.SIGTERM, signal.SIGKILL, None):
        with anyio.move_on_after(STOP_GRACE_S):
            while process.returncode is None:  # polled: wait() would also wait for pipes a child may hold
                await anyio.sleep(0.01)
        if process.returncode is not None or sig is None:
            break
        _signal_group(process.pid, sig)
    _signal_group(process.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
