"""Tool-call syntaxes (parse, render, instructions), chosen by name from a registry."""

from toolrl.parsers import hermes, llama3, pythonic, tags  # noqa: F401  (registers the parsers)
from toolrl.parsers.base import PARSERS, CallSyntax, ParseResult, get_parser, register_parser
from toolrl.parsers.tags import tag_parser, tag_syntax

__all__ = ["PARSERS", "CallSyntax", "ParseResult", "get_parser", "register_parser", "tag_parser", "tag_syntax"]
