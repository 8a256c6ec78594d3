"""Load a run config: YAML file (or the packaged default), then `--set a.b=value` overrides, then validation."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from toolrl.config.schema import RunConfig
from toolrl.errors import ConfigError
from toolrl.files import YAMLSyntaxError, load_yaml, read_text
from toolrl.text import clip

DEFAULT_CONFIG = "default.yaml"


def default_config_text() -> str:
    return resources.files("toolrl.config").joinpath(DEFAULT_CONFIG).read_text()


def _read_yaml(path: Path | None) -> dict[str, Any]:
    if path is None:
        text, where = default_config_text(), "the default config"
    else:
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist; pass a YAML file or omit it for the default")
        text, where = read_text(path, "config file"), str(path)
    return config_data(text, where)


def config_data(text: str, where: str) -> dict[str, Any]:
    """A config's YAML text as its mapping of sections (empty text: no keys)."""
    data = load_yaml(text, where)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override in place; the value is parsed as a YAML scalar or list."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r} must look like section.key=value")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part} is a value, not a section")
        node = child
    try:
        node[parts[-1]] = load_yaml(raw, f"override {key.strip()}") if raw.strip() else None
    except YAMLSyntaxError:
        node[parts[-1]] = raw


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


def format_validation_error(exc: ValidationError, where: str, model: type = RunConfig, prefix: str = "") -> str:
    """The first error of `exc` (validating `model`) as one line naming the key (`prefix` + its path)."""
    error = exc.errors()[0]
    key = prefix + ".".join(str(p) for p in error["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if error["type"] == "extra_forbidden":
        section = model
        for part in error["loc"][:-1]:
            field = section.model_fields.get(str(part))
            section = field.annotation if field else section
        known = ", ".join(getattr(section, "model_fields", {})) or "none"
        hint = "; environment settings go under env.options" if key.startswith("env.") and model is RunConfig else ""
        return f"{where}: unknown key '{clip(key, 120)}'; known keys here: {known}{hint}{more}"
    if error["type"] == "missing":
        return f"{where}: {clip(key, 120)} is required{more}"
    got = clip(repr(error.get("input")), 80)
    return clip(f"{where}: {clip(key, 120)} must be {_expected(error)}, got {got}{more}", 400)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read, override and validate a run config; raises ConfigError with a one-line message."""
    file = Path(path) if path is not None else None
    data = _read_yaml(file)
    for override in overrides or []:
        apply_override(data, override)
    return validate_config(data, str(file) if file else "config")


def validate_config(data: dict[str, Any], where: str) -> RunConfig:
    """A config's data validated (`where` names it in the one-line errors), the environment's own options
    checked now (before a model loads) and written out in full."""
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, where)) from None
    from toolrl.envs.base import environment_options

    config.env.options = environment_options(config.env).model_dump(mode="json")
    return config


def config_to_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
