"""MCP servers (stdio and streamable HTTP) through the official `mcp` SDK: one session per server, kept open.

Each server connection owns a background thread with its own event loop, where one task holds the session
(the SDK's anyio contexts must be entered and left in one task). Calls arrive from any event loop, such as a
rollout's, and are handed to that thread; the caller's deadline (the executor's) bounds each of them.

Failures are told apart, because training must not learn from them as the model's mistakes:
- a server that cannot start fails at once with its cause (exit code, last lines of its stderr, which goes to a
  log file), and is not relaunched in the background: the next call tries again, at most every few seconds;
- a server that dies while up is restarted by the next call; calls it had read raise `ServerCrashed` (they
  may have run: the executor re-runs them only when the tool is safe to repeat, `readOnlyHint` or
  `idempotentHint`); calls that find it down, and over stdio calls it never read (still in the pipe, or
  written after it died), raise `ServerUnavailable` (never run, so always sent again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from toolrl.errors import ToolError
from toolrl.loop_thread import LoopThread
from toolrl.text import clip, first_line, one_line
from toolrl.tools.function import Tool, json_schema_checker
from toolrl.tools.limits import InvalidArguments, NotDelivered, ServerCrashed, ServerUnavailable, ToolFailed

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (1.0, 30.0)
"""After a failed start, the next start waits this long (doubling per failure, up to the second value)."""
SPARE_FAILURES = 3
"""Failed starts of spare servers after which a connection stops keeping one."""
STOP_GRACE_S = 0.5
"""On close: time for a server to exit after its stdin closes, then after SIGTERM, before SIGKILL."""
STDERR_TAIL_LINES = 5
CALL_TAG = "toolrl/call"
"""The `_meta` key of a tools/call request that names it to a transport that tracks delivery (mcp_stdio.py);
servers ignore unknown `_meta`."""


def result_text(result: Any) -> str:
    """A CallToolResult as observation text: structured content as JSON, text parts joined, placeholders for
    non-text parts."""
    value = result_value(result)
    if isinstance(value, str):
        return value
    return "\n".join(p if isinstance(p, str) else f"[image content ({p.get('mime_type')}) not shown]" for p in value)


def result_value(result: Any) -> str | list[Any]:
    """A CallToolResult as a tool's value: its text (structured content as JSON, text parts joined), or with
    image content, the parts in order (text, and images as MCP image dicts that toolrl.tools.images reads);
    other parts (audio, resources) become placeholders."""
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        if isinstance(structured, dict) and list(structured) == ["result"]:
            # The SDK wraps a plain return value as {"result": value}; the model sees the value.
            value = structured["result"]
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return json.dumps(structured, ensure_ascii=False)
    parts: list[Any] = []
    for item in result.content:
        if item.type == "text":
            parts.append(item.text)
        elif item.type == "image":
            parts.append({"type": "image", "data": item.data, "mime_type": getattr(item, "mime_type", None)})
        else:
            mime = getattr(item, "mime_type", None) or getattr(getattr(item, "resource", None), "mime_type", None)
            parts.append(f"[{item.type} content{f' ({mime})' if mime else ''} not shown]")
    if any(isinstance(p, dict) for p in parts):
        return parts
    return "\n".join(parts)


def safe_to_repeat(spec: Any) -> bool:
    """MCP's annotations: a read-only tool, or one whose repeated calls have no additional effect."""
    notes = getattr(spec, "annotations", None)
    return bool(notes and (notes.read_only_hint or notes.idempotent_hint))


def _innermost(exc: BaseException) -> BaseException:
    """The one exception inside anyio's task-group wrappers."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _session_fault(exc: BaseException) -> str | None:
    """'lost' when `exc` means the connection broke (the call may have run), 'expired' when the server no longer
    knows the session (the call was refused, not run), None for an answer from a live server."""
    from mcp.shared.exceptions import MCPError
    from mcp.types import CONNECTION_CLOSED, INVALID_REQUEST

    if not isinstance(exc, MCPError):
        return "lost"  # transport errors: closed or broken streams, refused or dropped HTTP connections
    if exc.code == CONNECTION_CLOSED:
        return "lost"
    # Streamable HTTP: a 404 to a request with a session id means the server restarted or dropped the session;
    # the SDK surfaces it as this error (the HTTP status is not passed on).
    if exc.code == INVALID_REQUEST and exc.error.message in {"Session not found", "Session terminated"}:
        return "expired"
    return None


def _never_connected(exc: BaseException) -> bool:
    """An HTTP request that could not connect at all, so it was never sent (httpx.ConnectError)."""
    import httpx

    inner = _innermost(exc)
    return isinstance(inner, httpx.ConnectError | ConnectionRefusedError)


@dataclass
class _Live:
    """One open session and what ends it."""

    session: Any
    process: Any | None
    delivery: Any | None = None
    """stdio: which requests the server read (mcp_stdio.Delivery); None for HTTP."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class MCPServerConnection:
    """One MCP server; `tools()` lists its tools as `Tool`s named `server.tool`. Subclasses open a transport."""

    def __init__(self, name: str, connect_timeout_s: float = 30.0):
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self.connections = 0
        """Sessions opened so far (1 + restarts)."""
        self.cause: str | None = None
        """Why the last start failed, while the server is down."""
        self._live: _Live | None = None
        self._starting: asyncio.Task | None = None
        self._owners: set[asyncio.Task] = set()
        self._failed_starts = 0
        self._next_start = 0.0
        self._closed = False
        self._calls = 0
        self.spares = 0
        """Servers kept started and initialized besides the live one, one promoted at once when it crashes."""
        self._spares: list[_Live] = []
        self._spare_tasks: set[asyncio.Task] = set()
        self._spare_failures = 0
        self._loop = LoopThread(f"mcp-{name}")

    # ---- transport (subclasses) ------------------------------------------------------------------------------

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any, Any | None, Any | None]:
        """Enter the transport's context on `stack`; return its (read, write) streams, its process if any and
        what tells which requests the server read, if the transport can tell."""
        raise NotImplementedError

    def _describe_exit(self, process: Any | None) -> str:
        """How a server process ended (exit code, end of its stderr), as ' (...)', or ''."""
        return ""

    # ---- the session's lifetime (all on the connection's own loop) ------------------------------------------

    async def _hold(self, ready: asyncio.Future, spare: bool = False) -> None:
        """Open a session, report on `ready`, keep it until the server ends or close() is called. A spare waits,
        initialized, until a crash of the live one promotes it."""
        from mcp import ClientSession

        process = None
        try:
            async with AsyncExitStack() as stack:
                read, write, process, delivery = await self._open(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                await asyncio.wait_for(self._initialize(session, process), self.connect_timeout_s)
                live = _Live(session, process, delivery)
                if spare:
                    self._spares.append(live)
                else:
                    self._live = live
                    self.connections += 1
                ready.set_result(None)
                await _first(live.stop.wait(), *([_exited(process)] if process is not None else []))
                if self._live is live:
                    self._live = None
                if live in self._spares:
                    self._spares.remove(live)
        except Exception as exc:
            if not ready.done():
                ready.set_exception(ServerUnavailable(self._start_failure(exc, process)))
            else:
                log.warning("MCP server %s ended: %s", self.name, first_line(exc))

    async def _initialize(self, session: Any, process: Any | None) -> None:
        """initialize(), unless the process exits first: then fail at once, not after the connect timeout."""
        if process is None:
            await session.initialize()
            return
        init = asyncio.ensure_future(session.initialize())
        await _first(init, _exited(process))
        if not init.done() or init.cancelled():
            raise ConnectionError("the server exited before answering initialize")
        init.result()

    def _start_failure(self, exc: BaseException, process: Any | None) -> str:
        exc = _innermost(exc)
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
            reason = f"did not answer initialize within {self.connect_timeout_s:g} s"
        elif isinstance(exc, FileNotFoundError):
            reason = f"cannot run {exc.filename or 'the command'}: {exc.strerror or exc}"
        elif process is not None and process.returncode is not None:
            reason = "the server exited before answering initialize"
        else:
            reason = first_line(exc)
        return clip(f"MCP server {self.name} failed to start: {reason}{self._describe_exit(process)}", 800)

    async def _start(self) -> None:
        """Start the server and wait until it is up; on failure, remember why and when to try again."""
        ready = asyncio.get_running_loop().create_future()
        owner = asyncio.ensure_future(self._hold(ready))
        self._owners.add(owner)
        owner.add_done_callback(self._owners.discard)
        try:
            await ready
        except ServerUnavailable as exc:
            self.cause = str(exc)
            self._failed_starts += 1
            low, high = RESTART_BACKOFF_S
            self._next_start = time.monotonic() + min(low * 2 ** (self._failed_starts - 1), high)
            raise
        self._failed_starts, self.cause = 0, None
        self._start_spare()

    def _start_spare(self) -> None:
        """With `spares`, start servers in the background until that many are started or starting, initialized
        and idle, which crashes promote at once (a restart takes the server's start-up time, which on a busy
        machine can exceed a call's deadline; two spares also cover a second crash while the first one's
        replacement starts). A spare that fails to start is logged; after SPARE_FAILURES such failures, none
        is tried."""
        while (
            len(self._spares) + len(self._spare_tasks) < self.spares
            and not self._closed
            and self._spare_failures < SPARE_FAILURES
        ):
            ready = asyncio.get_running_loop().create_future()
            owner = asyncio.ensure_future(self._hold(ready, spare=True))
            self._owners.add(owner)
            owner.add_done_callback(self._owners.discard)

            async def watch(ready: asyncio.Future = ready) -> None:
                try:
                    await ready
                except ServerUnavailable as exc:
                    self._spare_failures += 1
                    log.warning("MCP server %s: a spare did not start: %s", self.name, exc)

            task = asyncio.ensure_future(watch())
            self._spare_tasks.add(task)
            task.add_done_callback(self._spare_tasks.discard)

    async def _ready(self) -> _Live:
        """The live session, starting (or restarting) the server when it is down and may be tried again."""
        while True:
            if self._closed:
                raise ServerUnavailable(f"MCP server {self.name} is closed")
            live = self._live
            if live is not None and (live.process is None or live.process.returncode is None):
                return live
            if live is not None:  # its process is gone; the owner is closing it
                self._live = None
                live.stop.set()
            spare = next((s for s in self._spares if s.process is not None and s.process.returncode is None), None)
            if spare is not None:
                self._spares.remove(spare)
                self._live = spare  # promoted: the restart is already done
                self.connections += 1
                self._start_spare()
                return spare
            if self._starting is None:
                if self._failed_starts and time.monotonic() < self._next_start:
                    raise ServerUnavailable(self.cause or f"MCP server {self.name} is down")
                self._starting = asyncio.ensure_future(self._start())
                self._starting.add_done_callback(self._started)
            await asyncio.shield(self._starting)

    def _started(self, task: asyncio.Task) -> None:
        self._starting = None
        if not task.cancelled():
            task.exception()  # retrieved here: its waiters got it

    async def _request(self, method: str, *args: Any, tag: str | None = None) -> Any:
        """`tag`: names a tools/call request to a transport that can tell whether the server read it."""
        live = await self._ready()
        try:
            if tag is not None and live.delivery is not None:
                return await getattr(live.session, method)(*args, meta={CALL_TAG: tag})
            return await getattr(live.session, method)(*args)
        except Exception as exc:
            fault = _session_fault(exc)
            if fault is None:
                raise
            if self._live is live:  # the first to notice ends the session; the next call restarts the server
                self._live = None
                live.stop.set()
            if fault == "expired":
                raise ServerUnavailable(f"MCP server {self.name} dropped the session; reconnecting") from None
            if _never_connected(exc):  # HTTP: the request found no server to take it
                reason = first_line(_innermost(exc))
                raise NotDelivered(f"MCP server {self.name} refused the connection ({reason})") from None
            if live.process is not None:  # a moment for its exit code, which says what happened
                await _first(_exited(live.process), asyncio.sleep(0.5))
            if tag is not None and live.delivery is not None:
                await _first(live.delivery.settled.wait(), asyncio.sleep(0.5))
                if not live.delivery.reached(tag):
                    raise NotDelivered(
                        f"MCP server {self.name} ended before reading the call{self._describe_exit(live.process)}"
                    ) from None
            detail = self._describe_exit(live.process) or f" ({first_line(_innermost(exc))})"
            raise ServerCrashed(f"MCP server {self.name} crashed during the call{detail}") from None

    # ---- the interface -------------------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        """Whether a session is open and its process running (not down, starting or restarting)."""
        live = self._live
        return live is not None and (live.process is None or live.process.returncode is None)

    def warm(self) -> None:
        """Start the server in the background (a pool's other members); a failure is logged, and retried later."""
        self._loop.submit(self._ready()).add_done_callback(
            lambda f: f.cancelled() or f.exception() is None or log.warning("%s", first_line(f.exception()))
        )

    async def call(self, tool: str, arguments: dict[str, Any]) -> str | list[Any]:
        from mcp.shared.exceptions import MCPError
        from mcp.types import INVALID_PARAMS

        self._calls += 1
        try:
            result = await self._loop.run(self._request("call_tool", tool, arguments, tag=str(self._calls)))
        except MCPError as exc:  # the server answered with a protocol error
            if exc.code == INVALID_PARAMS:
                raise InvalidArguments(one_line(exc.error.message)) from None
            raise ToolFailed(exc.error.message) from None
        if result.is_error:
            text = result_text(result)
            # The Python SDK's servers prefix every message; the observation already names the tool.
            raise ToolFailed(text.removeprefix(f"Error executing tool {tool}: ").strip() or f"{tool} reported an error")
        return result_value(result)

    def tools(self) -> list[Tool]:
        """The server's tools; starts it, and raises ToolError with the cause when it cannot."""
        try:
            listed = self._loop.submit(self._request("list_tools")).result(self.connect_timeout_s + 5)
        except ServerUnavailable as exc:
            raise ToolError(str(exc)) from None
        return [self._as_tool(t) for t in listed.tools]

    def _as_tool(self, spec: Any) -> Tool:
        async def call(**arguments: Any) -> str:
            return await self.call(spec.name, arguments)

        name = f"{self.name}.{spec.name}"
        schema = dict(spec.input_schema or {"type": "object", "properties": {}})
        try:
            check = json_schema_checker(schema, name)
        except ValueError as exc:  # the server's own schema is broken: let the server judge the arguments
            log.warning("%s; arguments are not checked before sending", exc)
            check = None
        repeat, about = safe_to_repeat(spec), spec.description or spec.name
        return Tool(name, about, schema, call, check=check, idempotent=repeat, text_only=True, runs_elsewhere=True)

    def close(self) -> None:
        """End the session and the server (stdin closed, then SIGTERM, then SIGKILL, each after a short grace)."""
        if self._closed:
            return
        self._closed = True

        async def stop() -> None:
            # Owners end through their transport's shutdown (stdin closed, SIGTERM, SIGKILL), starting ones too.
            for task in (self._starting, *self._spare_tasks, *self._owners):
                if task is not None:
                    task.cancel()
            if self._owners:
                await asyncio.wait(set(self._owners), timeout=4 * STOP_GRACE_S + 1)

        try:
            self._loop.submit(stop()).result(4 * STOP_GRACE_S + 2)
        except Exception as exc:
            log.warning("MCP server %s did not close cleanly: %s", self.name, first_line(exc))
        self._loop.stop()


async def _exited(process: Any) -> None:
    """Until `process` has exited. Polled: asyncio's wait() also waits for pipes a child of it may hold."""
    while process.returncode is None:
        await asyncio.sleep(0.05)


async def _first(*aws: Any) -> None:
    """Wait until the first of `aws` is done; cancel the others (awaitables given as coroutines are wrapped)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()


if sys.platform == "win32":  # pragma: no cover
    raise ImportError("toolrl's MCP stdio transport needs POSIX process groups")
