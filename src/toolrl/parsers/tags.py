"""Tag-style tool calls as in Search-R1: `<search>query</search>` becomes a call of a named tool."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from toolrl.parsers.base import CallGrammar, Parser, ParseResult, lark_literal, register_parser
from toolrl.tools.call import ToolCall, unknown_tool_error


def tag_parser(tags: Mapping[str, tuple[str, str]]) -> Parser:
    """A parser mapping `<tag>text</tag>` to tool `tags[tag][0]` with the text as argument `tags[tag][1]`;
    `tag_syntax` gives its renderer and instructions to register it with."""
    names = "|".join(re.escape(tag) for tag in tags)
    block = re.compile(rf"<({names})>(.*?)(</\1>|$)", re.DOTALL)

    def parse(text: str, known_tools: Collection[str] | None = None) -> ParseResult:
        result = ParseResult()
        for match in block.finditer(text):
            tag, content, close = match.group(1), match.group(2).strip(), match.group(3)
            tool, argument = tags[tag]
            if not close:
                result.errors.append(f"Error: <{tag}> is not closed; write <{tag}>...</{tag}>")
            elif not content:
                result.errors.append(f"Error: <{tag}></{tag}> is empty; put the {argument} between the tags")
            elif error := unknown_tool_error(tool, known_tools):
                result.errors.append(error)
            else:
                result.calls.append(ToolCall(tool, {argument: content}))
        return result

    return parse


def tag_grammar(tags: Mapping[str, tuple[str, str]]) -> CallGrammar:
    """The CallGrammar of `tag_parser(tags)`: `<tag>text</tag>` for each offered tool that has a tag, the text
    without `<`."""
    by_tool = {tool: tag for tag, (tool, _) in tags.items()}

    def grammar(tools: Sequence[tuple[str, dict[str, Any]]], several: bool) -> str:
        offered = [by_tool[name] for name, _ in tools if name in by_tool]
        if not offered:
            raise ValueError(f"no offered tool has a tag ({', '.join(sorted(by_tool))} do)")
        repeat = ' ("\\n" tag_call)*' if several else ""
        lines = [f"calls: tag_call{repeat}", "tag_call: " + " | ".join(f"tag_{k}" for k in range(len(offered)))]
        lines += [
            f"tag_{k}: {lark_literal(f'<{tag}>')} /[^<]+/ {lark_literal(f'</{tag}>')}" for k, tag in enumerate(offered)
        ]
        return "\n".join(lines) + "\n"

    return grammar


def tag_syntax(tags: Mapping[str, tuple[str, str]]) -> tuple[Callable[[Sequence[ToolCall]], str], str]:
    """(render, instructions) for the tags of `tag_parser(tags)`."""
    by_tool = {tool: (tag, argument) for tag, (tool, argument) in tags.items()}

    def render(calls: Sequence[ToolCall]) -> str:
        parts = []
        for call in calls:
            tag, argument = by_tool[call.name]
            parts.append(f"<{tag}> {call.arguments.get(argument, '')} </{tag}>")
        return "\n".join(parts)

    instructions = "\n".join(f"To call {tool}, write <{tag}> {arg} </{tag}>." for tag, (tool, arg) in tags.items())
    return render, instructions


SEARCH_R1 = {"search": ("search", "query")}
register_parser("search-r1", *tag_syntax(SEARCH_R1), grammar=tag_grammar(SEARCH_R1))(tag_parser(SEARCH_R1))
