"""Text helpers for messages shown to a model or a user: one bounded line, well-formed unicode."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import enum
import json
import re
from collections.abc import Iterable
from typing import Any

MAX_MESSAGE_CHARS = 600
"""Longest error message an observation carries (before the observation's own token limit)."""


def first_line(exc: BaseException) -> str:
    """An exception as one line for an observation or a status: its first non-blank line, else its type name."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' when one of `choices` is close to `word` (a typo), else ''."""
    close = closest(word, choices)
    return f" (did you mean {close!r}?)" if close else ""


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The one of `choices` closest to `word` when it is close enough to be a typo of it, else None."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return close[0] if close else None


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, with a marker when it was cut."""
    return text if len(text) <= limit else text[: limit - 14] + " ...[cut]"


def clip_path(path: object, limit: int = 200) -> str:
    """A path for a one-line message: cut in the middle when longer than `limit`, so that both where it starts
    and the name it ends with are shown."""
    text = str(path)
    if len(text) <= limit:
        return text
    keep = limit - 5
    return text[: keep // 2] + " ... " + text[len(text) - (keep - keep // 2) :]


def clip_head(text: str, limit: int) -> str:
    """`text` cut to its last `limit` characters from a line's start (a traceback's end is what says what went
    wrong), with a marker when it was cut."""
    if len(text) <= limit:
        return text
    tail = text[len(text) - limit + 10 :]
    return "[cut] ...\n" + (tail.split("\n", 1)[1] if "\n" in tail[:-1] else tail)


SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone surrogate (half of a broken \\u escape in JSON): not text; tokenizers and transports refuse it."""
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Control characters, tabs and newlines excepted."""


def well_formed_text(text: str) -> str:
    """`text` with lone surrogates (from escapes such as JSON's \\ud800) replaced by U+FFFD: tokenizers and
    transports refuse them."""
    return SURROGATE.sub("\ufffd", text)


_NOISE = re.compile(r"^\s*(For further information visit|Traceback \(most recent call last\))")


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A multi-line message (a validation report, a server's error) as one bounded line: its lines joined with
    '; ', documentation links dropped."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip() and not _NOISE.match(line)]
    return clip("; ".join(lines), limit)


def jsonable(value: Any) -> Any:
    """What JSON cannot hold as it is, as what it can: a pydantic model as its JSON-mode dump, a dataclass as its
    fields, a set as a sorted list, a date or a path as text, an enum as its value; anything else as str()."""
    if hasattr(value, "model_dump") and not isinstance(value, type):  # a pydantic model
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}  # nested ones: again, here
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return str(value)


def to_text(value: Any) -> str:
    """A tool's return value as observation text: strings as they are, anything else as JSON (pydantic models,
    dataclasses, dicts and lists of them too: `jsonable`), never a repr."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=jsonable)
    except (TypeError, ValueError, RecursionError):  # a circular structure, a NaN-free encoder's refusal
        return str(value)


def from_text(text: str) -> Any:
    """The value a tool's observation text stands for, where only the text crossed (a worker process, a
    server, the cache): what it decodes to as JSON, else the text itself."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text
