"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence

from toolrl.parsers.base import (
    CallFraming,
    ParseResult,
    call_from_object,
    decode_error,
    json_calls_grammar,
    register_parser,
)
from toolrl.tools.call import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(
    re.escape(OPEN)
    + r"((?:(?!"
    + re.escape(OPEN)
    + r").)*?)(?:"
    + re.escape(CLOSE)
    + r"|(?="
    + re.escape(OPEN)
    + r")|$)",
    re.DOTALL,
)
EXPECTED = 'write <tool_call>{"name": "...", "arguments": {...}}</tool_call>'
INSTRUCTIONS = (
    "To call a tool, reply with exactly:\n<tool_call>\n"
    '{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}\n</tool_call>'
)


def render_hermes(calls: Sequence[ToolCall]) -> str:
    return "\n".join(f"{OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n{CLOSE}" for c in calls)


GRAMMAR = json_calls_grammar("hermes", f"{OPEN}\n", f"\n{CLOSE}", "\n", "arguments")
"""Calls as render_hermes writes them."""


@register_parser("hermes", render_hermes, INSTRUCTIONS, grammar=GRAMMAR, framing=CallFraming(OPEN, CLOSE))
def parse_hermes(text: str, known_tools: Collection[str] | None = None) -> ParseResult:
    """Each `<tool_call>` opens a call that ends at its `</tool_call>` (or at the next `<tool_call>`, an error);
    a `</tool_call>` that closes nothing is an error too: no span that looks like a call goes unreported."""
    result = ParseResult()
    for match in _BLOCK.finditer(text):
        body, closed = match.group(1), match.group(0).endswith(CLOSE)
        if OPEN in body:  # the next call opened before this one closed: this one is broken, the next is read
            body, closed = body[: body.index(OPEN)], False
        if not closed:
            result.errors.append(f"Error: tool call is not closed with {CLOSE}; {EXPECTED}")
            continue
        call, error = _decode(body.strip(), known_tools)
        if error:
            result.errors.append(error)
        else:
            result.calls.append(call)
    stray = text.count(CLOSE) - sum(1 for m in _BLOCK.finditer(text) if m.group(0).endswith(CLOSE))
    if stray > 0:
        result.errors.append(f"Error: {CLOSE} without its {OPEN} ({stray}x); {EXPECTED}")
    return result


def _decode(body: str, known_tools: Collection[str] | None) -> tuple[ToolCall | None, str | None]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # ValueError: also a number over Python's digit limit
        return None, decode_error(exc, EXPECTED)
    return call_from_object(data, known_tools, EXPECTED)
