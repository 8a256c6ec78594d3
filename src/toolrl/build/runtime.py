"""The runtime of deployed tools: copied beside them, it runs inside the sandbox with the standard library only.

A deployed tool is a function over its SPEC: tables (kind -> normalised arguments -> answer) and what the
scaling stage changed (a field enum, a key shape, a unit, optional parameters). Correct arguments give the
right answer, deterministically; wrong ones raise ValueError with a message that says what to fix.
"""

import json


def _norm(value):
    return " ".join(str(value).split()).lower()


def _row_key(arguments):
    return json.dumps({k: _norm(v) for k, v in arguments.items()}, sort_keys=True)


def _names(spec, raw):
    key, shape = spec["key"], spec["key_shape"]
    if shape == "nested":
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ValueError(f"argument '{key}' must be an object with a string 'name', such as {{\"name\": \"...\"}}")
        return [raw["name"]]
    if shape == "list":
        if not isinstance(raw, list) or not raw or not all(isinstance(n, str) for n in raw):
            raise ValueError(f"argument '{key}' must be a non-empty list of names")
        return list(raw)
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"argument '{key}' must be a non-empty string (a {key.replace('_', ' ')}'s name)")
    return [raw]


def _check(spec, arguments):
    properties = spec["parameters"].get("properties", {})
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise ValueError(f"unknown argument '{unknown[0]}'; this tool takes: {', '.join(properties)}")
    for name in spec["parameters"].get("required", []):
        if name not in arguments:
            raise ValueError(f"missing argument '{name}'")
    for name, value in arguments.items():
        allowed = properties[name].get("enum")
        if allowed is not None and value not in allowed and properties[name].get("type") == "string":
            raise ValueError(f"argument '{name}' must be one of: {', '.join(map(str, allowed))}")


def _answer(spec, kinds, lookup_key, shown):
    for kind in kinds:
        answer = spec["tables"].get(kind, {}).get(lookup_key)
        if answer is not None:
            return answer
    what = spec["key"].replace("_", " ") if spec["key"] else "entry"
    raise ValueError(f"no {what} {shown!r} is known to this tool; check the name (or find it with another tool)")


def _in_unit(spec, answer, unit):
    """The answer in `unit`: as it is in the table's own unit; else divided exactly (decimal) and written in full
    (2725 thousands, 2.7255 thousands, 100000000000000000 thousands: never 2.725e+06 or 1e+17, which a check of
    the answer's text fails)."""
    if not spec["unit"] or spec["unit"][unit] == 1.0:
        return answer
    from decimal import Decimal

    value = (Decimal(str(answer)) / Decimal(repr(spec["unit"][unit]))).normalize()
    return format(value, "f")


def call(spec, arguments):
    """The tool's answer for `arguments`, or ValueError naming what is wrong."""
    _check(spec, arguments)
    kinds = spec["kinds"]
    if spec["field"]:
        kinds = spec["fields"][arguments[spec["field"]]]
    if not spec["key"]:  # the row is named by every argument but the optional ones, which change nothing
        named = {k: v for k, v in arguments.items() if k not in spec.get("optional", ())}
        return _answer(spec, kinds, _row_key(named), named)
    unit = arguments.get("unit", "units")
    names = _names(spec, arguments[spec["key"]])
    answers = {name: _in_unit(spec, _answer(spec, kinds, _norm(name), name), unit) for name in names}
    if spec["key_shape"] == "list":
        return json.dumps(answers, ensure_ascii=False)
    return answers[names[0]]
