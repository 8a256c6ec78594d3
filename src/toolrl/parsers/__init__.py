"""Tool-call parsers, chosen by name from a registry."""

from toolrl.parsers import hermes  # noqa: F401  (registers the parser)
from toolrl.parsers.base import PARSERS, ParseResult, get_parser, register_parser

__all__ = ["PARSERS", "ParseResult", "get_parser", "register_parser"]
