"""Model names, conversion of embedded models, and loading. Loading (torch, transformers) is imported when first
asked for, so that resolving a name (a run's checks before it loads anything) stays light."""

from toolrl.models.resolve import DEFAULT_MODEL, resolve_model

__all__ = ["DEFAULT_MODEL", "load_config", "load_model", "load_tokenizer", "pick_device", "resolve_model"]
_LOADING = {"load_config", "load_model", "load_tokenizer", "pick_device"}


def __getattr__(name: str):
    if name in _LOADING:
        from toolrl.models import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'toolrl.models' has no attribute {name!r}")
