"""Load a causal LM and its tokenizer onto a device."""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from safetensors import SafetensorError

from toolrl.errors import ModelNotFoundError
from toolrl.models.linear import use_onednn_linear
from toolrl.models.resolve import resolve_model
from toolrl.text import clip, first_line

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def transformer_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks under `module` that transformers marks as one (its gradient-checkpointing layers: decoder
    layers, and a vision-language model's vision blocks)."""
    return [m for m in module.modules() if hasattr(m, "_can_checkpoint_with_cache")]


@contextmanager
def loading(name: str, what: str):
    """A folder that resolves but does not load (corrupt weights, a tokenizer transformers cannot read) as one
    line naming the model, instead of a library's traceback."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, ImportError, KeyError, SafetensorError) as exc:
        if isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower():
            raise
        why = f"{type(exc).__name__}: {clip(first_line(exc), 200)}"
        raise ModelNotFoundError(
            f"model {clip(name, 120)}: its {what} could not be loaded ({why}); check the folder, or save the model "
            "again with save_pretrained"
        ) from exc


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    with loading(name, "tokenizer"):
        return AutoTokenizer.from_pretrained(resolve_model(name))


def load_config(name: str):
    """The model's transformers config, without its weights."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model(name))


def load_model(name: str, device: torch.device, dtype: str = "float32", cpu_linear: str = "onednn"):
    """A model on `device`; on CPU in float32 its linear layers run on oneDNN unless `cpu_linear` is "torch"
    (models/linear.py)."""
    from transformers import AutoModelForCausalLM

    if device.type == "cpu":
        # transformers repeats grouped key/value heads for masked multi-token attention unless told that the
        # kernel takes them grouped; PyTorch's CPU kernels do. Measured here: prefilling 64 sequences with the
        # engine's masks 1.9x faster. Not on CUDA, where a mask with grouped heads can fall back to a slow kernel.
        os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")

    path = resolve_model(name)
    from toolrl.models.vision import is_vision_model

    with loading(name, "weights"):
        if is_vision_model(path):  # a vision-language policy: its language model, vision tower and merger
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_pretrained(path, dtype=DTYPES[dtype], use_safetensors=True)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], use_safetensors=True)
    model = model.to(device)
    if cpu_linear == "onednn":
        use_onednn_linear(model)  # the fp32 CPU layers only: on CUDA or in bf16 none is switched
    return model
