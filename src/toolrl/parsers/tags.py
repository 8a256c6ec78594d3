"""Tag-style tool calls as in Search-R1: `<search>query</search>` becomes a call of a named tool."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from toolrl.parsers.base import CallGrammar, Parser, ParseResult, lark_literal, register_parser
from toolrl.text import clip
from toolrl.tools.call import ToolCall, unknown_tool_error


def tag_parser(tags: Mapping[str, tuple[str, str]]) -> Parser:
    """A parser mapping `<tag>text</tag>` to tool `tags[tag][0]` with the text as argument `tags[tag][1]`;
    `tag_syntax` gives its renderer and instructions to register it with. Every span that looks like a call is run
    or reported: a tag in another case or with attributes (`<SEARCH>`, `<search top="3">`), a tag opened inside
    its own (`<search><search>x</search></search>`, whose text would hold a tag), one never closed, a close
    without its open. One pass over the tags with a stack: linear in the text."""
    names = "|".join(re.escape(tag) for tag in tags)
    token = re.compile(rf"<(?P<open>{names})(?P<attributes>\s[^<>]*)?>|</(?P<close>{names})\s*>", re.IGNORECASE)
    canonical = {tag.lower(): tag for tag in tags}

    def parse(text: str, known_tools: Collection[str] | None = None) -> ParseResult:
        result = ParseResult()
        spans: list[tuple[re.Match[str], re.Match[str] | None, bool]] = []  # (open, close or None, nested), in order
        stack: list[tuple[re.Match[str], list[tuple[re.Match[str], re.Match[str] | None, bool]]]] = []
        stray: dict[str, int] = {}
        for m in token.finditer(text):
            if m.group("open"):
                stack.append((m, []))
                continue
            tag = canonical[m.group("close").lower()]
            at = next((i for i in range(len(stack) - 1, -1, -1) if canonical[stack[i][0]["open"].lower()] == tag), None)
            if at is None:
                stray[tag] = stray.get(tag, 0) + 1
                continue
            while len(stack) > at + 1:  # opened inside this span and never closed: part of it
                stack.pop()
            opened, inner = stack.pop()
            span = (opened, m, bool(inner))
            (stack[-1][1] if stack else spans).append(span)
        for opened, inner in stack:  # never closed: reported once (the outermost), what closed inside it is read
            spans.append((opened, None, False))
            spans.extend(inner)
        for opened, closed, nested in sorted(spans, key=lambda span: span[0].start()):
            tag = canonical[opened["open"].lower()]
            tool, argument = tags[tag]
            exact = f"<{tag}>...</{tag}>"
            if closed is None:
                result.errors.append(f"Error: <{tag}> is not closed; write <{tag}>...</{tag}>")
            elif nested:
                result.errors.append(f"Error: <{tag}> opened inside <{tag}>; write one {exact} per call")
            elif opened.group(0) != f"<{tag}>" or closed.group(0) != f"</{tag}>":
                shown = clip(" ".join(f"{opened.group(0)}...{closed.group(0)}".split()), 120)  # one line
                result.errors.append(f"Error: write the tags exactly {exact} (lower case, no attributes), not {shown}")
            elif not (content := text[opened.end() : closed.start()].strip()):
                result.errors.append(f"Error: <{tag}></{tag}> is empty; put the {argument} between the tags")
            elif error := unknown_tool_error(tool, known_tools):
                result.errors.append(error)
            else:
                result.calls.append(ToolCall(tool, {argument: content}))
        for tag, count in stray.items():
            result.errors.append(f"Error: </{tag}> without its <{tag}> ({count}x); write <{tag}>...</{tag}>")
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
