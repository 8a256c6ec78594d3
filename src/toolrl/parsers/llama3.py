"""Llama-3 JSON tool calls: `{"name": ..., "parameters": {...}}`, optionally after <|python_tag|>, `;`-separated."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence

from toolrl.parsers.base import ParseResult, call_from_object, decode_error, json_calls_grammar, register_parser
from toolrl.tools.call import ToolCall

PYTHON_TAG = "<|python_tag|>"
EXPECTED = 'write {"name": "...", "parameters": {...}}'
MAX_FAILED_DECODES = 64
"""Objects that fail to decode before the rest of the text is taken as prose: each failure costs up to the
text's length, so an unbounded number of them would make hostile text (a run of `{"`) quadratic."""
_DECODER = json.JSONDecoder()
_OBJECT_START = re.compile(r'\{\s*["}]')
_NAMED = re.compile(r'\{\s*"name"\s*:', re.IGNORECASE)
"""An object that opens like a call: when it does not decode, that is a format error, not prose."""
INSTRUCTIONS = (
    'To call a tool, reply with exactly:\n{"name": "<tool name>", "parameters": {<arguments as a JSON object>}}'
    '\n(several calls separated by "; ")'
)


def render_llama3_json(calls: Sequence[ToolCall]) -> str:
    return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}) for c in calls)


@register_parser("llama3-json", render_llama3_json, INSTRUCTIONS,
                 grammar=json_calls_grammar("llama3", "", "", "; ", "parameters"))  # fmt: skip
def parse_llama3_json(text: str, known_tools: Collection[str] | None = None) -> ParseResult:
    """Every top-level JSON object with a "name" key is a call; an object that opens with `{"name":` and does not
    decode is a format error. A reply that starts like a call (a `{` or the python tag) but holds no decodable
    object is a format error; other text is a plain answer. After MAX_FAILED_DECODES failures the rest is not
    read, and that is reported too."""
    result = ParseResult()
    body = text.replace(PYTHON_TAG, "").strip()
    failures = 0
    match = _OBJECT_START.search(body)  # only a `{` followed by a key or `}` can open an object
    while match is not None:
        at = match.start()
        if failures >= MAX_FAILED_DECODES:
            if unread := len(_NAMED.findall(body, at)):
                result.errors.append(f"Error: {unread} more calls after {failures} malformed objects were not read")
                result.more += unread - 1  # each counted, in one message
            break
        try:
            data, end = _DECODER.raw_decode(body, at)
        except (ValueError, RecursionError) as exc:  # ValueError: also a number over Python's digit limit
            failures += 1
            if _NAMED.match(body, at):
                result.errors.append(decode_error(exc, EXPECTED))
            match = _OBJECT_START.search(body, at + 1)
            continue
        if isinstance(data, dict) and any(isinstance(k, str) and k.lower() == "name" for k in data):
            call, error = call_from_object(data, known_tools, EXPECTED)
            if call:
                result.calls.append(call)
            else:
                result.errors.append(error)
        match = _OBJECT_START.search(body, end)
    if not result.calls and not result.errors and (text.lstrip().startswith(PYTHON_TAG) or body.startswith("{")):
        result.errors.append(f"Error: tool call is not valid JSON; {EXPECTED}")
    return result
