"""A tool worker process: imports tool functions by `module:qualname` and runs one call at a time.

Started by `ProcessRunner` as `python worker.py` (a file path, so that starting one imports only the standard
library). Requests arrive on stdin as length-prefixed pickles from the parent; replies leave as length-prefixed
JSON on the original stdout, so the parent never unpickles what a tool produced. Each call sends
`{"ready": true}` once its function is imported (the first call of a function imports it), then its reply: the
call's deadline starts at ready, so a module that is slow to import (torch, a model) is not a tool that overran.
A request without arguments only imports its function (a spare worker made ready before it is needed) and
answers `{"preloaded": ...}`. What tools print goes to
stderr, which the parent points at a log file. The worker is killed, never asked, when a call overruns.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import struct
import sys
from typing import Any, BinaryIO

HEADER = struct.Struct("!Q")


def _reply(value: Any) -> dict[str, Any]:
    """The reply for a tool's value; one that may hold images goes through toolrl.tools.images (imported
    only then: a worker starts with the standard library alone, and toolrl.text is imported once the parent's
    import path is set)."""
    if isinstance(value, bytes | bytearray | list | tuple) or (hasattr(value, "save") and hasattr(value, "mode")):
        from toolrl.tools.images import to_wire

        return to_wire(value)
    from toolrl.text import to_text

    return {"ok": to_text(value)}


def write_frame(stream: BinaryIO, data: bytes) -> None:
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO) -> bytes | None:
    """One frame, or None at the end of the stream (the other side is gone)."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    size = HEADER.unpack(header)[0]
    data = stream.read(size)
    return data if len(data) == size else None


def _kind(exc: BaseException) -> str:
    """How the parent should treat a failure, by class name (this process imports no toolrl module)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    for name, kind in (
        ("ServerUnavailable", "unavailable"),
        ("ServerCrashed", "crashed"),
        ("TransientToolError", "transient"),
        ("ConnectionError", "transient"),
        ("TimeoutError", "transient"),
        ("InvalidArguments", "invalid"),
        ("ToolFailed", "failed"),
    ):
        if name in names:
            return kind
    return "raised"


def _resolve(target: str, cache: dict[str, Any]) -> Any:
    if target not in cache:
        module, _, qualname = target.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        cache[target] = obj
    return cache[target]


def main() -> None:
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # tools cannot read the protocol
    os.dup2(2, 1)  # nor write into it: their prints go to the log
    first = read_frame(requests)
    if first is None:
        return
    sys.path[:] = pickle.loads(first)  # the parent's import path: its tools import here as they do there
    functions: dict[str, Any] = {}
    while (frame := read_frame(requests)) is not None:
        target, arguments = pickle.loads(frame)
        if arguments is None:  # preload: import only (a failure shows again at the call)
            with contextlib.suppress(BaseException):
                _resolve(target, functions)
            write_frame(replies, json.dumps({"preloaded": target}).encode())
            continue
        try:
            function = _resolve(target, functions)
            write_frame(replies, b'{"ready": true}')
            reply = _reply(function(**arguments))
        except BaseException as exc:  # a tool's failure, even SystemExit, is an answer, not the worker's end
            reply = {"error": _kind(exc), "message": str(exc), "type": type(exc).__name__}
        write_frame(replies, json.dumps(reply, ensure_ascii=False).encode("utf-8", "surrogatepass"))


if __name__ == "__main__":
    main()
