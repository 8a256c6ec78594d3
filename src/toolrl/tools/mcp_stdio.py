"""MCP servers over stdio: the server's process, started in its own process group with its stderr in a log
file, and our own stdio transport (the SDK's yields the process, which we need to tell a start-up failure
from a crash). The session handling shared with the HTTP transports is in mcp.py."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from toolrl.text import one_line
from toolrl.tools.mcp import STDERR_TAIL_LINES, STOP_GRACE_S, MCPServerConnection


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
    ):
        self.command, self.args, self.cwd = command, list(args), cwd
        self.env = dict(env) if env else None
        self.log_path = Path(log_path) if log_path else None
        self._log_start = 0
        super().__init__(name, connect_timeout_s)

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any, Any | None]:
        from mcp.client.stdio import get_default_environment

        log_file = stack.enter_context(self._stderr_log())
        environment = get_default_environment() | (self.env or {})
        return await stack.enter_async_context(
            stdio_transport([self.command, *self.args], environment, self.cwd, log_file)
        )

    def _stderr_log(self):
        if self.log_path is None:
            return open(os.devnull, "wb")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.log_path, "ab")  # noqa: SIM115
        handle.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.command}\n".encode())
        handle.flush()
        self._log_start = handle.tell()
        return handle

    def _describe_exit(self, process: Any | None) -> str:
        if process is None or process.returncode is None:
            return ""
        code = process.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        tail = self.stderr_tail()
        return f" ({how}{'; stderr: ' + tail if tail else ''})"

    def stderr_tail(self) -> str:
        """The last lines this session's server wrote to stderr, as one bounded line ('' when not logged)."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(max(self._log_start, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()[-STDERR_TAIL_LINES:]
        return one_line("\n".join(lines), 400)


@asynccontextmanager
async def stdio_transport(argv: list[str], env: dict[str, str], cwd: str | None, stderr: Any):
    """Newline-delimited JSON-RPC over a subprocess's stdin/stdout, as the SDK's `stdio_client`, but yielding
    the process too: its exit code explains a failure, and its process group is what close() kills."""
    import anyio
    from anyio.streams.text import TextReceiveStream
    from mcp.shared.message import SessionMessage
    from mcp.types import jsonrpc_message_adapter

    process = await anyio.open_process(argv, env=env, cwd=cwd, stderr=stderr, start_new_session=True)
    to_session, read_stream = anyio.create_memory_object_stream(0)
    write_stream, from_session = anyio.create_memory_object_stream(0)

    async def read_stdout() -> None:
        buffer = ""
        async with to_session:
            try:
                async for chunk in TextReceiveStream(process.stdout, errors="replace"):
                    lines = (buffer + chunk).split("\n")
                    buffer = lines.pop()
                    for line in lines:
                        if not line.strip():
                            continue
                        try:
                            message: Any = SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
                        except ValueError as exc:
                            message = exc  # the session reports a malformed line
                        await to_session.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass

    async def write_stdin() -> None:
        async with from_session:
            try:
                async for message in from_session:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode("utf-8", "surrogatepass"))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await to_session.aclose()  # the session sees the connection end, not a hung request

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(write_stdin)
        try:
            yield read_stream, write_stream, process
        finally:
            with anyio.CancelScope(shield=True):
                await _stop_process(process)
            tasks.cancel_scope.cancel()


async def _stop_process(process: Any) -> None:
    """Close stdin; SIGTERM the process group after a grace period, SIGKILL after another. Whatever the server
    started in its group is killed with it."""
    import anyio

    with suppress(Exception):  # already closed or broken
        await process.stdin.aclose()
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
