"""A tiny randomly initialised Llama with the real SmolLM2 tokenizer and chat template, for fast tests."""

from __future__ import annotations

from pathlib import Path

import torch

from toolrl.models.resolve import DEFAULT_MODEL, resolve_model


def make_tiny_model(target: Path, seed: int = 0, hidden: int = 64, layers: int = 2, init_std: float = 0.3) -> Path:
    """Save the model and tokenizer to `target`. `init_std` is larger than the usual 0.02 so the output
    distribution is peaked: sampled tokens repeat, which gives RL tests a learnable signal."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=init_std,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target
