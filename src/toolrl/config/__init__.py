"""Run configuration: pydantic schema, YAML loading and command-line overrides."""

from toolrl.config.loader import config_to_yaml, load_config
from toolrl.config.schema import RunConfig

__all__ = ["RunConfig", "config_to_yaml", "load_config"]
