"""Reading a run config: its YAML file (or the packaged default) as a mapping, `--set a.b=value` overrides, and
the config written back as YAML. Resolving it (code imported, names checked) is config/resolve.py."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from toolrl.config.schema import RunConfig
from toolrl.errors import ConfigError
from toolrl.files import YAMLSyntaxError, load_yaml, read_text
from toolrl.text import clip_path

DEFAULT_CONFIG = "default.yaml"


def default_config_text() -> str:
    return resources.files("toolrl.config").joinpath(DEFAULT_CONFIG).read_text()


def read_config_data(path: Path | None) -> dict[str, Any]:
    if path is None:
        text, where = default_config_text(), "the default config"
    else:
        try:
            found = path.exists()
        except OSError as exc:  # a name the system cannot look up (too long, ...)
            raise ConfigError(f"config file {clip_path(path, 200)}: {exc.strerror or exc}; pass a YAML file or omit "
                              "it for the default") from None  # fmt: skip
        if not found:
            raise ConfigError(f"config file {clip_path(path, 200)} does not exist; pass a YAML file or omit it for "
                              "the default")  # fmt: skip
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


def config_to_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
