"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence

from toolrl.parsers.base import ParseResult, call_from_object, decode_error, register_parser
from toolrl.tools.call import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
EXPECTED = 'write <tool_call>{"name": "...", "arguments": {...}}</tool_call>'
INSTRUCTIONS = (
    "To call a tool, reply with exactly:\n<tool_call>\n"
    '{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}\n</tool_call>'
)


def render_hermes(calls: Sequence[ToolCall]) -> str:
    return "\n".join(f"{OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n{CLOSE}" for c in calls)


@register_parser("hermes", render_hermes, INSTRUCTIONS)
def parse_hermes(text: str, known_tools: Collection[str] | None = None) -> ParseResult:
    result = ParseResult()
    for match in _BLOCK.finditer(text):
        body = match.group(1).strip()
        if not match.group(0).endswith(CLOSE):
            result.errors.append(f"Error: tool call is not closed with {CLOSE}; {EXPECTED}")
            continue
        call, error = _decode(body, known_tools)
        if error:
            result.errors.append(error)
        else:
            result.calls.append(call)
    return result


def _decode(body: str, known_tools: Collection[str] | None) -> tuple[ToolCall | None, str | None]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # ValueError: also a number over Python's digit limit
        return None, decode_error(exc, EXPECTED)
    return call_from_object(data, known_tools, EXPECTED)
