"""The parser interface and registry: model text in, tool calls and format errors out, never an exception."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from toolrl.errors import ConfigError
from toolrl.tools.call import ToolCall


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One-line format-error observations for the model, one per malformed call."""


Parser = Callable[[str, Collection[str] | None], ParseResult]
PARSERS: dict[str, Parser] = {}


def register_parser(name: str) -> Callable[[Parser], Parser]:
    def add(fn: Parser) -> Parser:
        PARSERS[name] = fn
        return fn

    return add


def get_parser(name: str) -> Parser:
    try:
        return PARSERS[name]
    except KeyError:
        raise ConfigError(f"rollout.parser: unknown parser {name!r}; known: {', '.join(sorted(PARSERS))}") from None
