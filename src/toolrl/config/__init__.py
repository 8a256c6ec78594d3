"""Run configuration: the pydantic schema (schema.py; a run name's rule in run_name.py), reading YAML and `--set`
overrides (loader.py), and resolving a config once: code imported, names checked against the registries
(resolve.py)."""

from toolrl.config.loader import config_to_yaml
from toolrl.config.resolve import resolve_config, resolve_data
from toolrl.config.schema import RunConfig

load_config = resolve_config
"""The name of earlier versions."""

__all__ = ["RunConfig", "config_to_yaml", "load_config", "resolve_config", "resolve_data"]
