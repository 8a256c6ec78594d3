"""Text helpers for messages shown to a model or a user: one bounded line, well-formed unicode."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_MESSAGE_CHARS = 600
"""Longest error message an observation carries (before the observation's own token limit)."""


def first_line(exc: BaseException) -> str:
    """An exception as one line for an observation or a status: its first non-blank line, else its type name."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, with a marker when it was cut."""
    return text if len(text) <= limit else text[: limit - 14] + " ...[cut]"


_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed_text(text: str) -> str:
    """`text` with lone surrogates (from escapes such as JSON's \\ud800) replaced by U+FFFD: tokenizers and
    transports refuse them."""
    return _SURROGATE.sub("\ufffd", text)


_NOISE = re.compile(r"^\s*(For further information visit|Traceback \(most recent call last\))")


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A multi-line message (a validation report, a server's error) as one bounded line: its lines joined with
    '; ', documentation links dropped."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip() and not _NOISE.match(line)]
    return clip("; ".join(lines), limit)


def to_text(value: Any) -> str:
    """A tool's return value as observation text: strings as they are, anything else as JSON where it can be."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
