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
from toolrl.text import clip
from toolrl.tools.call import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_OPEN = r"<tool_call(?:\s[^<>]*)?>"
"""An opening tag as a model may write it: any case, with attributes (both reported, not run)."""
_CLOSE = r"</tool_call\s*>"
_BLOCK = re.compile(
    rf"(?P<open>{_OPEN})(?P<body>(?:(?!{_OPEN}).)*?)(?:(?P<close>{_CLOSE})|(?={_OPEN})|$)", re.DOTALL | re.IGNORECASE
)
_CLOSES = re.compile(_CLOSE, re.IGNORECASE)
_DECODER = json.JSONDecoder()
_BETWEEN = re.compile(r"[\s,;]*")
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
    a `</tool_call>` that closes nothing is an error too: no span that looks like a call goes unreported. A tag in
    another case or with attributes (`<TOOL_CALL>`, `<tool_call id="1">`) is reported, not run. Several calls in
    one tag (a JSON list of calls, or objects one after another) are each run or reported."""
    result = ParseResult()
    closed_blocks = 0
    for match in _BLOCK.finditer(text):
        opening, body, closing = match.group("open", "body", "close")
        if closing is None:
            result.errors.append(f"Error: tool call is not closed with {CLOSE}; {EXPECTED}")
            continue
        closed_blocks += 1
        if opening != OPEN or closing != CLOSE:
            shown = clip(" ".join(f"{opening}...{closing}".split()), 120)  # one line, whatever the tags held
            result.errors.append(f"Error: write the tags exactly {OPEN} and {CLOSE} (lower case, no attributes), "
                                 f"not {shown}; {EXPECTED}")  # fmt: skip
            continue
        for call, error in _decode_all(body.strip(), known_tools):
            if error:
                result.errors.append(error)
            else:
                result.calls.append(call)
    stray = len(_CLOSES.findall(text)) - closed_blocks
    if stray > 0:
        result.errors.append(f"Error: {CLOSE} without its {OPEN} ({stray}x); {EXPECTED}")
    return result


def _decode_all(body: str, known_tools: Collection[str] | None) -> list[tuple[ToolCall | None, str | None]]:
    """The calls of one tag's body: one object, a JSON list of them, or objects one after another (separated by
    white space, commas or semicolons); what does not decode is one error."""
    try:
        data = json.loads(body)
    except RecursionError as exc:
        return [(None, decode_error(exc, EXPECTED))]
    except ValueError as exc:  # also a number over Python's digit limit
        if not isinstance(exc, json.JSONDecodeError) or not exc.msg.startswith("Extra data"):
            return [(None, decode_error(exc, EXPECTED))]
        found, at = [], 0
        while at < len(body):  # objects one after another
            try:
                data, at = _DECODER.raw_decode(body, at)
            except (ValueError, RecursionError) as exc:
                return [*found, (None, decode_error(exc, EXPECTED))]
            found.append(call_from_object(data, known_tools, EXPECTED))
            at = _BETWEEN.match(body, at).end()
        return found
    if isinstance(data, list) and data:
        return [call_from_object(item, known_tools, EXPECTED) for item in data]
    return [call_from_object(data, known_tools, EXPECTED)]
