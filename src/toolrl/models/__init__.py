"""Model names, conversion of embedded models, and loading."""

from toolrl.models.loading import load_config, load_model, load_tokenizer, pick_device
from toolrl.models.resolve import DEFAULT_MODEL, resolve_model

__all__ = ["DEFAULT_MODEL", "load_config", "load_model", "load_tokenizer", "pick_device", "resolve_model"]
