"""Llama-3 JSON tool calls: `{"name": ..., "parameters": {...}}`, optionally after <|python_tag|>, `;`-separated."""

from __future__ import annotations

import json
from collections.abc import Collection

from toolrl.parsers.base import ParseResult, call_from_object, register_parser

PYTHON_TAG = "<|python_tag|>"
EXPECTED = 'write {"name": "...", "parameters": {...}}'
_DECODER = json.JSONDecoder()


@register_parser("llama3-json")
def parse_llama3_json(text: str, known_tools: Collection[str] | None = None) -> ParseResult:
    """Every top-level JSON object with a "name" key is a call. A reply that starts like a call (a `{` or the
    python tag) but holds no decodable object is a format error; other text is a plain answer."""
    result = ParseResult()
    body = text.replace(PYTHON_TAG, "").strip()
    at = body.find("{")
    while at >= 0:
        try:
            data, end = _DECODER.raw_decode(body, at)
        except (json.JSONDecodeError, RecursionError):
            at = body.find("{", at + 1)
            continue
        if isinstance(data, dict) and "name" in data:
            call, error = call_from_object(data, known_tools, EXPECTED)
            if call:
                result.calls.append(call)
            else:
                result.errors.append(error)
        at = body.find("{", end)
    if not result.calls and not result.errors and (text.lstrip().startswith(PYTHON_TAG) or body.startswith("{")):
        result.errors.append(f"Error: tool call is not valid JSON; {EXPECTED}")
    return result
