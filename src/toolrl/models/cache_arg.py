"""The name a transformers forward takes its KV cache by: `cache` in recent 5.x releases (5.24 here),
`past_key_values` in earlier ones (deprecated by the rename, to be removed in 5.40). Every forward toolrl makes
with a cache passes it as `**cache_arg(model, cache)`, so both sides of the rename work and no deprecation
warning reaches a run's log."""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def _takes_cache(cls: type) -> bool:
    return "cache" in inspect.signature(cls.forward).parameters


def cache_arg(model, cache: Any) -> dict[str, Any]:
    """{"cache": cache} where the model's forward takes `cache`, else {"past_key_values": cache} (a peft
    wrapper is looked through: its forward takes **kwargs)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {"cache": cache} if _takes_cache(type(base)) else {"past_key_values": cache}
