"""A tiny randomly initialised Llama with the real SmolLM2 tokenizer and chat template, for fast tests."""

from __future__ import annotations

from pathlib import Path

import torch

from toolrl.models.resolve import DEFAULT_MODEL, resolve_model


def save_random_model(target: Path, architecture: str = "llama", seed: int = 0, **shape) -> Path:
    """A randomly initialised causal LM of `architecture` (a transformers model type: llama, qwen2, ...) and
    `shape` (its config's sizes), with the default model's tokenizer and chat template, saved to `target`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    config = AutoConfig.for_model(
        architecture,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


def make_tiny_model(target: Path, seed: int = 0, hidden: int = 64, layers: int = 2, init_std: float = 0.3) -> Path:
    """Save the model and tokenizer to `target`. `init_std` is larger than the usual 0.02 so the output
    distribution is peaked: sampled tokens repeat, which gives RL tests a learnable signal."""
    return save_random_model(
        target,
        "llama",
        seed,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,  # as SmolLM2-135M, whose tokenizer it uses: the files env prompts are 2.3k
        tie_word_embeddings=True,
        initializer_range=init_std,
    )
