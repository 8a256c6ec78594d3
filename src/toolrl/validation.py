"""pydantic's validation errors as one line naming the key and what it must be (configs, env options, tool
files, build specs share it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from toolrl.text import clip, did_you_mean


def _expected(error: dict[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "literal_error":
        return f"one of {ctx.get('expected')}"
    if kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
        return error["msg"].lower().removeprefix("input should be ")
    names = {
        "int_parsing": "an integer",
        "int_from_float": "an integer",
        "int_type": "an integer",
        "float_parsing": "a number",
        "float_type": "a number",
        "finite_number": "a finite number",
        "bool_parsing": "true or false",
        "bool_type": "true or false",
        "string_type": "a string",
        "model_type": "a section (mapping)",
        "model_attributes_type": "a section (mapping)",
        "tuple_type": "a list",
        "too_short": "a longer list",
        "too_long": "a shorter list",
    }
    return names.get(kind, error["msg"])


def format_validation_error(
    exc: ValidationError,
    where: str,
    model: type[BaseModel],
    prefix: str = "",
    hint: Callable[[str], str] | None = None,
) -> str:
    """The first error of `exc` (validating `model`) as one line naming the key (`prefix` + its path); `hint(key)`
    follows the list of known keys when a key is unknown."""
    error = exc.errors()[0]
    key = prefix + ".".join(str(p) for p in error["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if error["type"] == "extra_forbidden":
        section = model
        for part in error["loc"][:-1]:
            field = section.model_fields.get(str(part))
            section = field.annotation if field else section
        fields = getattr(section, "model_fields", {})
        known, guess = ", ".join(fields) or "none", did_you_mean(error["loc"][-1], fields)
        return (f"{where}: unknown key '{clip(key, 120)}'{guess}; known keys here: {known}"
                f"{hint(key) if hint else ''}{more}")  # fmt: skip
    if error["type"] == "missing":
        return f"{where}: {clip(key, 120)} is required{more}"
    if error["type"] == "value_error":  # a validator's own sentence says what is wrong and what to do
        field = key.rstrip(".")  # empty for a model's own check
        named = f"{clip(field, 120)}: " if field else ""
        return clip(f"{where}: {named}{error['msg'].removeprefix('Value error, ')}{more}", 400)
    got = clip(repr(error.get("input")), 80)
    return clip(f"{where}: {clip(key, 120)} must be {_expected(error)}, got {got}{more}", 400)
