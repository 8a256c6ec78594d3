"""pydantic's validation errors as one line naming the key and what it must be (configs, env options, tool
files, build specs share it)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

from toolrl.text import CONTROL, SURROGATE, clip, did_you_mean


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


def nearest_keys(word: Any, known: Iterable[str], n: int = 5) -> str:
    """'nearest keys here: a, b, c (N in all)': the `n` known keys closest to an unknown one, not all of them."""
    known = [str(k) for k in known]
    if not known:
        return "no keys are allowed here"
    ranked = sorted(known, key=lambda k: -difflib.SequenceMatcher(None, str(word)[:200], k).ratio())[:n]
    more = f" ({len(known)} in all)" if len(known) > n else ""
    return f"nearest keys here: {', '.join(ranked)}{more}"


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
        guess = did_you_mean(error["loc"][-1], fields)
        return (f"{where}: unknown key '{clip(key, 120)}'{guess}; {nearest_keys(error['loc'][-1], fields)}"
                f"{hint(key) if hint else ''}{more}")  # fmt: skip
    if error["type"] == "missing":
        return f"{where}: {clip(key, 120)} is required{more}"
    if error["type"] == "value_error":  # a validator's own sentence says what is wrong and what to do
        field = key.rstrip(".")  # empty for a model's own check
        named = f"{clip(field, 120)}: " if field else ""
        return clip(f"{where}: {named}{error['msg'].removeprefix('Value error, ')}{more}", 400)
    got = clip(safe_repr(error.get("input")), 80)
    return clip(f"{where}: {clip(key, 120)} must be {_expected(error)}, got {got}{more}", 400)


MAX_INT = 2**53
"""The largest integer a config, tool file or options field takes (JSON's exact integers): a seed of 5,000 hex
digits or a step count of 10**30 is a typo or an attack, never a setting."""
MAX_FLOAT = 1e15


def safe_repr(value: Any) -> str:
    """repr() that never fails (an int past 4,300 decimal digits cannot be shown) and never runs long."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a number of {value.bit_length():,} bits"
    try:
        return clip(repr(value), 200)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"


def number_problem(value: Any, key: str = "", depth: int = 0) -> str | None:
    """The first number in `value` (a field's raw input: nested lists and mappings too) out of range, or string
    that is not text, as 'KEY: why'; None when there is none."""
    if isinstance(value, bool) or depth > 32:
        return None
    if isinstance(value, int) and abs(value) > MAX_INT:
        return f"{key or 'a value'}: {safe_repr(value)} is out of range (at most 2**53 in size); give a smaller number"
    if isinstance(value, float) and abs(value) > MAX_FLOAT:
        return f"{key or 'a value'}: {value:g} is out of range (at most 1e15 in size); give a smaller number"
    if isinstance(value, str) and (found := CONTROL.search(value) or SURROGATE.search(value)):
        what = "a lone surrogate" if SURROGATE.match(found.group()) else "a control character"
        return f"{key or 'a value'}: holds {what} U+{ord(found.group()):04X} at offset {found.start()}; remove it"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        if problem := number_problem(v, f"{key}.{k}" if key else str(k), depth + 1):
            return problem
    return None


def bounded_numbers(data: Any) -> Any:
    """A `model_validator(mode="before")` body: refuses a number out of range, or a string with a control
    character or a lone surrogate, anywhere in the input."""
    if problem := number_problem(data):
        raise ValueError(problem)
    return data


class BoundedModel(BaseModel):
    """A model whose every value is bounded (bounded_numbers): configs, environment options, tool files."""

    @model_validator(mode="before")
    @classmethod
    def _numbers_in_range(cls, data: Any) -> Any:
        return bounded_numbers(data)

    @model_validator(mode="after")
    def _values_in_range(self):  # what a string became ("1e+300" is a float field's 1e300)
        bounded_numbers(self.__dict__)
        return self
