"""Pythonic tool calls: a Python list of calls, `[f(a=1), g("x", b=2)]`, or bare calls, one per line
(`cd(folder="docs")`), as published multi-turn function-calling benchmarks write them.

Calls are parsed with `ast` and argument values with `ast.literal_eval`: nothing is executed. Positional
arguments are bound to the tool's parameters in order when the known tools come with their parameter names
(as the rollout gives them). A bare call counts only for a known tool (other `name(` at the start of a line is
prose or code); a known tool's call that does not parse is a format error, never silence.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterator, Mapping, Sequence

from toolrl.parsers.base import ParseResult, register_parser, well_formed
from toolrl.text import clip
from toolrl.tools.call import ToolCall, unknown_tool_error

EXPECTED = 'write [tool_name(arg="value", other=1)]'
INSTRUCTIONS = (
    "To call tools, reply with a Python list of calls with keyword arguments, exactly:\n"
    '[tool_name(argument="value", other=1)]'
)
MAX_CHARS = 20_000
MAX_BARE_CALLS = 16
"""Bare calls (and their errors) read from one turn: each costs a scan to its closing parenthesis."""
_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_BARE_START = re.compile(r"(?m)^[ \t]*([A-Za-z_][\w.]*)[ \t]*\(")


def render_pythonic(calls: Sequence[ToolCall]) -> str:
    """Calls as a Python list with keyword arguments (values as Python literals)."""
    rendered = (f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in calls)
    return "[" + ", ".join(rendered) + "]"


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _parse(source: str) -> ast.AST | None:
    try:
        return ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _closing(text: str, start: int, opening: str, closing: str, attempts: int = 20) -> Iterator[int]:
    """Positions where the depth of `opening` brackets from `start` returns to zero, skipping string literals;
    a few candidates are tried, never one parse per closing bracket (quadratic on hostile input)."""
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
        elif ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                yield i
                attempts -= 1
                if attempts == 0:
                    return
            depth = max(depth, 0)


def _list_calls(text: str, start: int) -> list[ast.Call] | None:
    """The calls of the list that opens at `start`, if it is exactly a list of calls."""
    for end in _closing(text, start, "[", "]"):
        node = _parse(text[start : end + 1])
        if isinstance(node, ast.List) and all(isinstance(e, ast.Call) for e in node.elts):
            return list(node.elts)
    return None


def _bare_calls(text: str, known: Collection[str] | None, result: ParseResult) -> list[ast.Call]:
    """Calls of known tools written alone at the start of a line; a known one that does not parse is an error."""
    calls = []
    for match in _BARE_START.finditer(text):
        if len(calls) + len(result.errors) >= MAX_BARE_CALLS:
            break
        name = match.group(1)
        if known is not None and name not in known:
            continue
        open_at = match.end() - 1
        node = None
        for end in _closing(text, open_at, "(", ")", attempts=3):
            node = _parse(text[match.start(1) : end + 1])
            if isinstance(node, ast.Call):
                break
        if isinstance(node, ast.Call):
            calls.append(node)
        else:
            result.errors.append(f"Error: the call of {clip(name, 80)} is not valid Python; {EXPECTED}")
    return calls


def _arguments(node: ast.Call, name: str, known: Collection[str] | None) -> tuple[dict | None, str | None]:
    """The call's arguments by name (positional ones bound by the tool's parameters), or an error."""
    try:
        positional = [ast.literal_eval(arg) for arg in node.args]
        keywords = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None, f"Error: the arguments of {clip(name, 80)} must be literal values; {EXPECTED}"
    if len(keywords) != len(node.keywords):
        return None, f"Error: **kwargs are not allowed in a call to {clip(name, 80)}; {EXPECTED}"
    if positional:
        params = known.get(name) if isinstance(known, Mapping) else None
        if params is None:
            return None, f"Error: {clip(name, 80)} needs keyword arguments here; {EXPECTED}"
        if len(positional) > len(params):
            return None, f"Error: {clip(name, 80)} takes at most {len(params)} arguments, got {len(positional)}"
        bound = dict(zip(params, positional, strict=False))
        if twice := sorted(set(bound) & set(keywords)):
            return None, f"Error: {clip(name, 80)} got {twice[0]!r} both by position and by name"
        keywords = {**bound, **keywords}
    return well_formed(keywords), None


@register_parser("pythonic", render_pythonic, INSTRUCTIONS)
def parse_pythonic(text: str, known_tools: Collection[str] | None = None) -> ParseResult:
    result = ParseResult()
    match = _LIST_START.search(text)
    if match is not None:
        nodes = _list_calls(text, match.start())
        if nodes is None:
            result.errors.append(f"Error: tool calls are not a valid Python list of calls; {EXPECTED}")
            return result
    else:
        nodes = _bare_calls(text, known_tools, result)
    for node in nodes:
        name = _name(node.func)
        if name is None:
            result.errors.append(f"Error: each call needs a tool name; {EXPECTED}")
            continue
        arguments, error = _arguments(node, name, known_tools)
        error = error or unknown_tool_error(name, known_tools)
        if error:
            result.errors.append(error)
        else:
            result.calls.append(ToolCall(well_formed(name), arguments))
    return result
