"""Pythonic tool calls: Python lists of calls, `[f(a=1), g("x", b=2)]`, or bare calls (`cd(folder="docs")`),
as published multi-turn function-calling benchmarks write them: one per line, or several on a line separated
by commas or semicolons, before, after or between lists.

Calls are parsed with `ast` and argument values with `ast.literal_eval`: nothing is executed. Positional
arguments are bound to the tool's parameters in order when the known tools come with their parameter names
(as the rollout gives them). What counts as a call: every list whose first element is a call, a known tool's
name followed by `(` anywhere, and any `name(` at the start of a line or right after another call (an unknown
tool there is an error, not prose). A span that counts and does not parse is a format error, never silence;
`name(` inside a sentence with a name that is no tool is prose. Reading is linear in the text: when its budget
of characters runs out, what was not read is reported as an error.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from toolrl.parsers.base import ParseResult, register_parser, well_formed
from toolrl.text import clip
from toolrl.tools.call import ToolCall, unknown_tool_error

EXPECTED = 'write [tool_name(arg="value", other=1)]'
INSTRUCTIONS = (
    "To call tools, reply with a Python list of calls with keyword arguments, exactly:\n"
    '[tool_name(argument="value", other=1)]'
)
MAX_CHARS = 20_000
"""The longest span (a list or a call) read from its opening bracket."""
READ_FACTOR = 8
"""The characters all bracket scans and parses of one reply may read: READ_FACTOR times its length plus
MAX_CHARS (each span is scanned a few times; hostile text of many openings would otherwise be quadratic)."""
MAX_CALLS = 1_024
"""Calls read from one reply (each costs a parse; a turn runs at most rollout.max_calls_per_turn of them): the
call-like spans after them are counted in one error. 100 KB of bare calls (14,285) had taken 300-400 ms."""
_START = re.compile(r"(?P<list>\[)\s*[A-Za-z_][\w.]*\s*\(|(?<![\w.])(?P<name>[A-Za-z_][\w.]*)[ \t]*\(")
"""A list that opens with a call, or a name and its bracket (with spaces between: the prose `word (`)."""
_SEPARATOR = re.compile(r"[ \t]*[,;]?[ \t]*")


def render_pythonic(calls: Sequence[ToolCall]) -> str:
    """Calls as a Python list with keyword arguments (values as Python literals)."""
    rendered = (f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in calls)
    return "[" + ", ".join(rendered) + "]"


@dataclass
class _Budget:
    left: int

    def spend(self, n: int) -> bool:
        self.left -= n
        return self.left >= 0


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _parse(source: str, budget: _Budget) -> ast.AST | None:
    if not budget.spend(len(source)):
        return None
    try:
        return ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _closing(text: str, start: int, opening: str, closing: str, budget: _Budget, attempts: int) -> Iterator[int]:
    """Positions where the depth of `opening` brackets from `start` returns to zero, skipping string literals;
    a few candidates, each scan paid from `budget`."""
    depth, quote, escaped = 0, "", False
    stop = min(len(text), start + MAX_CHARS, start + max(budget.left, 0))
    i = start
    for i in range(start, stop):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote or ch == "\n":  # a quote left open ends with its line
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                budget.spend(i + 1 - start)
                yield i
                start = i + 1
                attempts -= 1
                if attempts == 0:
                    return
            depth = max(depth, 0)
    budget.spend(max(i + 1 - start, 0))


def _line_start(text: str, at: int) -> bool:
    return text[text.rfind("\n", 0, at) + 1 : at].strip() == ""


def _after_broken(text: str, start: int, first_close: int | None) -> int:
    """Where reading goes on after a span that does not parse: past its first closing bracket, else (never
    closed) at the end of its line."""
    if first_close is not None:
        return first_close + 1
    end = text.find("\n", start)
    return len(text) if end < 0 else end


class _Reader:
    """One reply read from left to right: each span that counts as a call (or a list of calls) becomes calls or
    one format error, and reading goes on after it."""

    def __init__(self, text: str, known: Collection[str] | None):
        self.text, self.known = text, known
        self.budget = _Budget(READ_FACTOR * len(text) + MAX_CHARS)
        self.nodes: list[ast.Call] = []
        self.errors: list[tuple[int, str]] = []
        self.more = 0
        """Call-like spans past MAX_CALLS, counted in one error (ParseResult.more)."""
        self.after_call = -1
        """Where the last call or list ended (a `name(` right after it, past a separator, is a call too)."""

    def read(self) -> None:
        pos = 0
        while (match := _START.search(self.text, pos)) is not None:
            if len(self.nodes) >= MAX_CALLS:  # each call costs a parse: the rest is counted, not read
                unread = sum(1 for _ in _START.finditer(self.text, match.start()))
                self.errors.append((match.start(), f"Error: {unread} more call-like spans after the first "
                                    f"{MAX_CALLS} calls were not read. Write fewer calls"))  # fmt: skip
                self.more = unread - 1
                return
            if self.budget.left <= 0:
                unread = len(self.text) - match.start()
                self.errors.append(
                    (
                        match.start(),
                        f"Error: the reply is too long to read every call; {unread} characters after "
                        "the last call read were not read. Write fewer, shorter calls",
                    )
                )
                return
            pos = self._list(match) if match.group("list") else self._bare(match)

    def _list(self, match: re.Match) -> int:
        start, first = match.start(), None
        for end in _closing(self.text, start, "[", "]", self.budget, attempts=20):
            first = end if first is None else first
            node = _parse(self.text[start : end + 1], self.budget)
            if isinstance(node, ast.List) and all(isinstance(e, ast.Call) for e in node.elts):
                self.nodes.extend(node.elts)
                self.after_call = end + 1
                return end + 1
        self.errors.append((start, f"Error: tool calls are not a valid Python list of calls; {EXPECTED}"))
        return _after_broken(self.text, start, first)

    def _bare(self, match: re.Match) -> int:
        name, start = match.group("name"), match.start("name")
        named = self.known is not None and name in self.known
        placed = _line_start(self.text, start) or (
            self.after_call >= 0 and _SEPARATOR.match(self.text, self.after_call).end() == start
        )
        if match.end("name") != match.end() - 1 or not (placed or named):
            return match.end()  # prose: `word (` or a word and a bracket inside a sentence, naming no tool
        node, first = None, None
        for end in _closing(self.text, match.end() - 1, "(", ")", self.budget, attempts=3):
            first = end if first is None else first
            node = _parse(self.text[start : end + 1], self.budget)
            if isinstance(node, ast.Call):
                if not named and not _literal_arguments(node):
                    return match.end()  # `f(x)`: code or maths in prose, not a call of a tool
                self.nodes.append(node)
                self.after_call = end + 1
                return end + 1
        if named or _looks_like_call(self.text, match):
            self.errors.append((start, f"Error: the call of {clip(name, 80)} is not valid Python; {EXPECTED}"))
            return _after_broken(self.text, start, first)
        return match.end()


def _literal_arguments(node: ast.Call) -> bool:
    try:
        for value in [*node.args, *(kw.value for kw in node.keywords)]:
            ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return False
    return True


def _looks_like_call(text: str, match: re.Match) -> bool:
    """A name that is no tool, at a line's start, whose bracket does not close into a call reads as a broken call
    only when what follows the bracket looks like arguments (`key=` or a literal), else as prose."""
    rest = text[match.end() : match.end() + 40].lstrip()
    return bool(re.match(r"""[A-Za-z_]\w*\s*=|["'\d\[{]""", rest))


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
    reader = _Reader(text, known_tools)
    reader.read()
    result = ParseResult()
    for node in reader.nodes:
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
    result.errors.extend(message for _, message in reader.errors)
    result.more += reader.more
    return result
