"""Help as a user writes the command: each option's value named the way it is typed (`--set KEY=VALUE`,
`--config PATH`, `--num-tasks N`), flags with no value shown (`--json`), never Python's type names (`<bool>`,
`<list[str]>`, which typer prints by default)."""

from __future__ import annotations

from functools import partial
from typing import Any

VALUE_NAMES = {"set": "KEY=VALUE", "resume": "RUN", "out": "PATH"}
"""Options whose value has a name of its own; the others are named by their type (PATH, N, NUMBER) or, for text, by
the option (--model MODEL)."""


def metavar(param: Any) -> str:
    """What the help shows for `param`'s value: '' for a flag."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    name = max(param.opts, key=len).lstrip("-") if param.opts else param.name or "value"  # --set, not set_
    if name in VALUE_NAMES:
        return VALUE_NAMES[name]
    described = getattr(param, "type_descriptor", None)  # typer >= 0.29; earlier ones keep click's param.type
    if described is not None:
        if described.is_choice:
            return "|".join(str(getattr(choice, "value", choice)) for choice in described.choices)
        base = described.annotation
        if described.is_list and getattr(base, "__args__", None):
            base = base.__args__[0]
        kind = "Path" if described.is_path else getattr(base, "__name__", "")
    else:
        kind = type(param.type).__name__
        if kind == "Choice":
            return "|".join(str(choice) for choice in param.type.choices)
    if kind == "Path":
        return "PATH"
    if kind in ("int", "IntParamType", "IntRange"):
        return "N"
    if kind in ("float", "FloatParamType", "FloatRange"):
        return "NUMBER"
    return name.replace("-", "_").upper()


def as_typed(command: Any) -> Any:
    """`command` (a click command or group, as typer builds it) and every command under it, each parameter's help
    showing the value as it is typed; arguments show their name alone. Returns `command`."""
    for param in command.params:
        if param.param_type_name == "argument":
            param.metavar = param.metavar or param.name.upper()
            param.display_type_rich = _nothing  # the name column already says what to type
        elif param.metavar is None:
            param.metavar = metavar(param)
        if getattr(param, "min", None) is not None or getattr(param, "max", None) is not None:
            param._get_number_range_help_str = partial(bounds, param.min, param.max)
    own = command.get_help_option

    def help_option(ctx):
        option = own(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        as_typed(sub)
    return command


def bounds(low: float | None, high: float | None) -> str:
    """A number's range as help says it: 'at least 1', '0 to 65535' (typer writes '[0<=x<=65535]')."""
    if low is not None and high is not None:
        return f"{low} to {high}"
    return f"at least {low}" if low is not None else f"at most {high}"


def _nothing(ctx: Any) -> None:
    return None


WORDS = {
    "float_parsing": "{input!r} is not a number (for example 0.7)",
    "float_type": "{input!r} is not a number (for example 0.7)",
    "int_parsing": "{input!r} is not a whole number (for example 10)",
    "int_type": "{input!r} is not a whole number (for example 10)",
    "int_from_float": "{input!r} is not a whole number (for example 10)",
    "bool_parsing": "{input!r} is not true or false",
    "greater_than_equal": "{input!r} is below {ge}, its least value",
    "greater_than": "{input!r} must be above {gt}",
    "less_than_equal": "{input!r} is above {le}, its greatest value",
    "less_than": "{input!r} must be below {lt}",
    "enum": "{input!r} is not one of {expected}",
    "literal_error": "{input!r} is not one of {expected}",
    "path_type": "{input!r} is not a path",
}
"""A value's error in our words, by the kind of error pydantic (typer's conversion) reports; its own wording is kept
for any other kind."""


def value_error(exc: BaseException) -> str | None:
    """'--temperature: 'hot' is not a number (for example 0.7)' for a click error on a value that pydantic could
    not convert (typer >= 0.29 converts with it), else None."""
    cause, param = exc.__cause__, getattr(exc, "param", None)
    errors = getattr(cause, "errors", None)
    if param is None or not callable(errors):
        return None
    try:
        first = errors()[0]
        words = WORDS[first["type"]].format(input=first.get("input"), **first.get("ctx", {}))
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    name = max(param.opts, key=len) if getattr(param, "opts", None) else (param.name or "value").upper()
    return f"{name}: {words}"
