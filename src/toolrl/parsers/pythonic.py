"""Pythonic tool calls: a Python list of calls with keyword arguments, `[f(a=1), g(b="x")]`.

The list is parsed with `ast` and the argument values with `ast.literal_eval`: nothing is executed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection

from toolrl.parsers.base import ParseResult, register_parser
from toolrl.tools.call import ToolCall, unknown_tool_error

EXPECTED = 'write [tool_name(arg="value", other=1)]'
MAX_CHARS = 20_000
_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _calls_in(source: str) -> list[ast.Call] | None:
    """The calls of `source` if it is exactly a list of calls, else None."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List) or not all(isinstance(e, ast.Call) for e in tree.body.elts):
        return None
    return list(tree.body.elts)


def _list_ends(text: str, start: int, attempts: int = 20):
    """Positions where the bracket depth opened at `start` returns to zero, skipping string literals; a few
    candidates are tried, never one parse per `]` (which is quadratic on hostile input)."""
    depth, quote, escaped = 0, "", False
    for i in range(start, min(len(text), start + MAX_CHARS)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                yield i
                attempts -= 1
                if attempts == 0:
                    return
            depth = max(depth, 0)


@register_parser("pythonic")
def parse_pythonic(text: str, known_tools: Collection[str] | None = None) -> ParseResult:
    result = ParseResult()
    match = _START.search(text)
    if match is None:
        return result
    start = match.start()
    calls = None
    for end in _list_ends(text, start):
        calls = _calls_in(text[start : end + 1])
        if calls is not None:
            break
    if calls is None:
        result.errors.append(f"Error: tool calls are not a valid Python list of calls; {EXPECTED}")
        return result
    for node in calls:
        name = _name(node.func)
        if name is None or node.args:
            result.errors.append(f"Error: each call needs a tool name and keyword arguments only; {EXPECTED}")
            continue
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            result.errors.append(f"Error: the arguments of {name} must be literal values; {EXPECTED}")
            continue
        if len(arguments) != len(node.keywords):
            result.errors.append(f"Error: **kwargs are not allowed in a call to {name}; {EXPECTED}")
            continue
        error = unknown_tool_error(name, known_tools)
        if error:
            result.errors.append(error)
        else:
            result.calls.append(ToolCall(name, arguments))
    return result
