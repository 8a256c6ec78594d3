"""Tool-call syntaxes by name: each parses model text into calls and format errors (never an exception),
renders calls in its own syntax (for in-context examples) and says how to call (for the fallback prompt), so
that a run prompts in the syntax it parses.

Every parser returns a result for any text, in time linear in its length; its error messages are one bounded
line each. Arguments decoded from escapes (JSON's \\ud800) may hold lone surrogates, which no tokenizer or
transport can encode: they become U+FFFD.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.registry import Registry
from toolrl.text import clip, first_line, well_formed_text
from toolrl.tools.call import UNKNOWN_TOOL, ToolCall, unknown_tool_error

log = logging.getLogger(__name__)


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One-line format-error observations for the model, one per malformed call."""
    more: int = 0
    """Call-like spans not run beyond those the errors tell one by one (summed up in the last error)."""

    @property
    def unknown_tools(self) -> int:
        """Errors that are well-formed calls of a tool not offered: failed calls (tool errors), not format errors."""
        return sum(error.startswith(UNKNOWN_TOOL) for error in self.errors)

    @property
    def not_run(self) -> int:
        """Spans that looked like calls and were not run: what the `format_errors` metric counts."""
        return len(self.errors) + self.more

    def within(self, max_calls: int) -> ParseResult:
        """At most `max_calls` calls to run and `max_calls` errors to show; what is past either is told in one
        more error (`rollout.max_calls_per_turn`) and counted, never dropped."""
        calls, errors = self.calls[:max_calls], self.errors[:max_calls]
        over, hidden = len(self.calls) - len(calls), len(self.errors) - len(errors)
        if not over and not hidden:
            return self
        told = [f"{over} calls after the first {max_calls} were not run"] if over else []
        told += [f"{hidden} more malformed calls are not shown"] if hidden else []
        errors.append(f"Error: at most {max_calls} tool calls per turn; " + "; ".join(told))
        return ParseResult(calls, errors, self.more + over + hidden - 1)


Parser = Callable[[str, Collection[str] | None], ParseResult]
"""(model text, known tools) -> calls and errors. Known tools may be a mapping from each tool's name to its
parameter names in order (parsers that take positional arguments bind them with it), or None (any name)."""
Render = Callable[[Sequence[ToolCall]], str]
CallGrammar = Callable[[Sequence[tuple[str, dict[str, Any]]], bool], str]
"""(tools as (name, JSON schema of its arguments), several calls allowed) -> Lark rules (llguidance's dialect,
schemas embedded with %json) whose rule `calls` derives exactly the calls of those tools the parser reads:
what an engine samples under when a call is forced (`tool_choice: required`). Rule names other than `calls`
start with the syntax's own prefix, so that a caller can add rules beside them."""

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}
"""How constrained JSON is written: as json.dumps writes it (the renderers' and most models' spacing); keywords
llguidance does not know are ignored rather than refused."""


@dataclass(frozen=True)
class CallFraming:
    """Where a call stands in the text, for streaming it as it is written: `opening`, then a JSON object whose
    "name" comes first and whose arguments (under one of `argument_keys`) come second, then `closing`."""

    opening: str
    closing: str
    argument_keys: tuple[str, ...] = ("arguments", "parameters")


@dataclass(frozen=True)
class CallSyntax:
    """One way of writing tool calls: parse, render, and the instructions the fallback prompt gives; optionally
    the grammar of its calls (to force one) and its framing (to stream one as it is written)."""

    name: str
    parse: Parser
    render: Render
    instructions: str
    """How to call a tool, shown after the tools' schemas when the chat template does not show them."""
    grammar: CallGrammar | None = None
    framing: CallFraming | None = None

    def __call__(self, text: str, known_tools: Collection[str] | None = None) -> ParseResult:
        return self.parse(text, known_tools)


PARSERS: Registry[CallSyntax] = Registry("parser", "rollout.parser")


def register_parser(
    name: str,
    render: Render | None = None,
    instructions: str | None = None,
    *,
    grammar: CallGrammar | None = None,
    framing: CallFraming | None = None,
):
    """Register a parser function under `name`, with how to write its calls (`render`, `instructions`).
    Without them, prompts show Hermes-style calls and a warning says so. `grammar`: the Lark rules of its calls
    (CallGrammar), without which a forced call is refused; `framing`: where its calls stand in the text (for
    streaming their arguments as they are written; without it a turn that may call tools streams at its end)."""

    def add(parse: Parser) -> Parser:
        fallback = render is None or instructions is None
        if fallback and name != "hermes":
            log.warning("parser %s has no renderer: in-context calls and the tool prompt use Hermes syntax", name)
        hermes = PARSERS.get("hermes")
        PARSERS[name] = CallSyntax(
            name,
            parse,
            render or (hermes.render if hermes else _json_lines),
            instructions or (hermes.instructions if hermes else ""),
            grammar,
            framing,
        )
        return parse

    return add


def lark_literal(text: str) -> str:
    """`text` as a Lark string literal ('' for no text: Lark has no empty literal)."""
    return json.dumps(text) if text else ""


def json_calls_grammar(prefix: str, opening: str, closing: str, separator: str, arguments_key: str) -> CallGrammar:
    """The CallGrammar of calls written `opening` + {"name": NAME, arguments_key: {...}} + `closing`, several
    joined by `separator`: each tool's arguments under its own schema."""

    def grammar(tools: Sequence[tuple[str, dict[str, Any]]], several: bool) -> str:
        bodies = [
            {"type": "object", "properties": {"name": {"const": name}, arguments_key: parameters or {"type": "object"}},
             "required": ["name", arguments_key], "additionalProperties": False}
            for name, parameters in tools
        ]  # fmt: skip
        schema = {"anyOf": bodies, "x-guidance": JSON_STYLE}
        repeat = f" ({json.dumps(separator)} {prefix}_call)*" if several else ""
        call = " ".join(part for part in (lark_literal(opening), f"{prefix}_body", lark_literal(closing)) if part)
        return f"calls: {prefix}_call{repeat}\n{prefix}_call: {call}\n{prefix}_body: %json {json.dumps(schema)}\n"

    return grammar


def get_parser(name: str) -> CallSyntax:
    return PARSERS.lookup(name)


def _json_lines(calls: Sequence[ToolCall]) -> str:
    return "\n".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in calls)


def well_formed(value: Any) -> Any:
    """`value` with lone surrogates in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return well_formed_text(value)
    if isinstance(value, dict):
        return {well_formed(k): well_formed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [well_formed(v) for v in value]
    return value


def decode_error(exc: BaseException, expected: str) -> str:
    """The format error for text that json (or ast) could not decode, as one bounded line."""
    if isinstance(exc, RecursionError):
        return f"Error: tool call is nested too deeply; {expected}"
    if isinstance(exc, json.JSONDecodeError):
        return f"Error: tool call is not valid JSON ({exc.msg} at char {exc.pos}); {expected}"
    return f"Error: tool call is not valid JSON ({clip(first_line(exc), 120)}); {expected}"  # a number too long


CALL_KEYS = ("name", "arguments", "parameters")
"""The keys of a call written as a JSON object."""


def call_from_object(
    data: Any, known_tools: Collection[str] | None, expected: str
) -> tuple[ToolCall | None, str | None]:
    """A decoded `{"name": ..., "arguments" | "parameters": {...}}` as a call, or a one-line error. A key in
    another case (`"Name"`, `"ARGUMENTS"`) is an error: run without it, the call would lose its arguments."""
    if isinstance(data, dict) and (bad := [k for k in data if isinstance(k, str) and k.lower() in CALL_KEYS
                                           and k not in CALL_KEYS]):  # fmt: skip
        return None, f"Error: write the key {clip(repr(bad[0]), 40)} in lower case; {expected}"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None, f'Error: tool call needs a "name" string; {expected}'
    name = well_formed(data["name"])
    shown = clip(repr(name), 80)
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None, f"Error: the arguments of {shown} are not a JSON object; {expected}"
    if not isinstance(arguments, dict):
        return None, f"Error: the arguments of {shown} must be a JSON object; {expected}"
    error = unknown_tool_error(name, known_tools)
    return (None, error) if error else (ToolCall(name, well_formed(arguments)), None)
