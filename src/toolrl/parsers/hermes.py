"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn."""

from __future__ import annotations

import json
import re
from collections.abc import Collection

from toolrl.parsers.base import ParseResult, register_parser
from toolrl.tools.call import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
EXPECTED = 'write <tool_call>{"name": "...", "arguments": {...}}</tool_call>'


@register_parser("hermes")
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
    except json.JSONDecodeError as exc:
        return None, f"Error: tool call is not valid JSON ({exc.msg} at char {exc.pos}); {EXPECTED}"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None, f'Error: tool call needs a "name" string; {EXPECTED}'
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, f'Error: "arguments" of {data["name"]} is not a JSON object; {EXPECTED}'
    if not isinstance(arguments, dict):
        return None, f'Error: "arguments" of {data["name"]} must be a JSON object; {EXPECTED}'
    if known_tools is not None and data["name"] not in known_tools:
        known = ", ".join(sorted(known_tools)) or "none"
        return None, f"Error: unknown tool {data['name']!r}; available tools: {known}"
    return ToolCall(data["name"], arguments), None
