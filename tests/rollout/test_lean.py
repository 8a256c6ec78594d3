"""The engine's lean forward (rollout/lean.py) against transformers' forward: the same greedy tokens and
log-probs, through the shared prefix and without it, on the small-batch kernel and on oneDNN; and transformers'
forward wherever the lean one does not apply (an unregistered family, LoRA, sliding windows)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.harness.tiny import save_random_model
from toolrl.models import load_model
from toolrl.models.linear import PackedWeights
from toolrl.models.native import wanted
from toolrl.rollout import HFEngine, SamplingParams
from toolrl.rollout.lean import LEAN_FAMILIES, LeanForward, register_lean_family

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.3)  # fmt: skip
KERNELS = ["onednn"] + (["native"] if wanted("auto") else [])


def _generate(model, tokenizer, prompts, lean: bool, kernel: str = "auto", max_new_tokens: int = 8):
    engine = HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"), lean=lean,
                      decode_kernel=kernel)  # fmt: skip

    async def run():
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        return await asyncio.gather(*(engine.generate(i, p, params) for i, p in enumerate(prompts)))

    outs = asyncio.run(run())
    stats = dict(engine.stats)
    engine.free_memory()
    engine.close()
    return outs, stats


def _lean_of(model) -> LeanForward | None:
    return LeanForward.of(model, PackedWeights(model))


def _plain_logprobs(model, prompt, ids) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].float()
    plain = torch.log_softmax(logits, -1)
    return [float(plain[len(prompt) + i - 1, t]) for i, t in enumerate(ids)]


def _same_as_transformers(model, tokenizer, prompts, kernel="auto", max_new_tokens=8) -> dict:
    lean, stats = _generate(model, tokenizer, prompts, True, kernel, max_new_tokens)
    theirs, their_stats = _generate(model, tokenizer, prompts, False, kernel, max_new_tokens)
    assert their_stats.get("lean_forwards", 0) == 0
    assert [o.ids for o in lean] == [o.ids for o in theirs]
    for prompt, out in zip(prompts, lean, strict=True):
        expect = _plain_logprobs(model, prompt, out.ids)
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(expect), atol=1e-4)
    return stats


# a 40-token system part every prompt shares (read once through the cascade), then each prompt's own tokens
SHARED = [list(range(1000, 1040)) + [2000 + i, 2100 + i, 2200] for i in range(6)]
APART = [[3000 + 7 * i + j for j in range(12 + i)] for i in range(5)]  # nothing in common, unequal lengths


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("prompts", [SHARED, APART], ids=["shared-prefix", "apart"])
def test_the_lean_forward_samples_what_transformers_samples(tiny_model_dir, tokenizer, prompts, kernel):
    model = load_model(str(tiny_model_dir), torch.device("cpu")).eval()
    stats = _same_as_transformers(model, tokenizer, prompts, kernel)
    assert stats["lean_forwards"] == stats["forwards"] > 0
    if prompts is SHARED:
        assert stats["cascade_forwards"] > 0


def test_qwen2_with_projection_biases_runs_lean(tmp_path, tokenizer):
    path = save_random_model(tmp_path / "qwen2", "qwen2", **SHAPE)
    model = load_model(str(path), torch.device("cpu")).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    assert _same_as_transformers(model, tokenizer, SHARED)["lean_forwards"] > 0


def test_a_prefill_of_more_rows_than_the_kernel_takes(tiny_model_dir, tokenizer):
    """40 prompts of 20 tokens: prefills and decode steps beyond the small-batch kernel's rows run each layer's
    own forward for q/k/v and gate/up (no copy of the fused weights takes them)."""
    model = load_model(str(tiny_model_dir), torch.device("cpu")).eval()
    prompts = [[4000 + 13 * i + j for j in range(20)] for i in range(40)]
    assert _same_as_transformers(model, tokenizer, prompts, max_new_tokens=3)["lean_forwards"] > 0


def test_weights_changed_between_rollouts_are_packed_again(tiny_model_dir, tokenizer):
    """An optimizer step between rollouts: the fused copies follow the new weights."""
    model = load_model(str(tiny_model_dir), torch.device("cpu")).eval()
    before, _ = _generate(model, tokenizer, SHARED[:2], True)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.up_proj.weight.mul_(-1.5)
            layer.self_attn.k_proj.weight.add_(0.2)
    after = _same_as_transformers(model, tokenizer, SHARED[:2])
    assert after["lean_forwards"] > 0
    assert [o.ids for o in before] != [o.ids for o in _generate(model, tokenizer, SHARED[:2], True)[0]]


def test_the_fused_copies_hold_no_more_than_the_layers_copies(tiny_model_dir, tokenizer):
    model = load_model(str(tiny_model_dir), torch.device("cpu")).eval()
    engine = HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))

    async def run():
        params = SamplingParams(temperature=0.0, max_new_tokens=4)
        await asyncio.gather(*(engine.generate(i, p, params) for i, p in enumerate(SHARED)))

    asyncio.run(run())
    names = set(engine.packed._copies)
    assert "model.layers.0.self_attn.q_proj+model.layers.0.self_attn.k_proj+model.layers.0.self_attn.v_proj" in names
    assert "model.layers.0.mlp.gate_proj+model.layers.0.mlp.up_proj" in names
    assert "model.layers.0.self_attn.q_proj" not in names  # not held twice
    linear_bytes = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert 0 < engine.packed.peak_bytes <= linear_bytes * 1.1  # the native layout pads rows to 16
    engine.close()


def test_families_and_modules_it_does_not_know_run_transformers_forward(tmp_path, tiny_model_dir, tokenizer):
    from peft import LoraConfig, get_peft_model

    model = load_model(str(tiny_model_dir), torch.device("cpu")).eval()
    assert _lean_of(model) is not None
    lora = get_peft_model(
        load_model(str(tiny_model_dir), torch.device("cpu")), LoraConfig(r=4, target_modules=["q_proj"])
    )
    assert _lean_of(lora.get_base_model()) is None  # a LoRA wrapper is not a plain linear layer
    assert _lean_of(lora) is None  # nor is the PEFT model itself the family's module tree
    partial = load_model(str(tiny_model_dir), torch.device("cpu"))
    partial.config.partial_rotary_factor = 0.5
    assert _lean_of(partial) is None
    _, stats = _generate(lora.get_base_model().eval(), tokenizer, SHARED[:2], True)
    assert stats["forwards"] > 0 and stats.get("lean_forwards", 0) == 0
    sliding = save_random_model(tmp_path / "sliding", "qwen2", use_sliding_window=True, sliding_window=16,
                                max_window_layers=0, **SHAPE)  # fmt: skip
    assert _lean_of(load_model(str(sliding), torch.device("cpu"))) is None
    mistral = load_model(str(save_random_model(tmp_path / "mistral", "mistral", sliding_window=None, **SHAPE)),
                         torch.device("cpu")).eval()  # fmt: skip
    assert "mistral" not in LEAN_FAMILIES and _lean_of(mistral) is None


def test_a_family_registered_from_outside_the_package_runs_lean(tmp_path, tokenizer, monkeypatch):
    """A user's own registration: Mistral without a sliding window is Llama's arithmetic."""
    monkeypatch.setattr("toolrl.rollout.lean.LEAN_FAMILIES", dict(LEAN_FAMILIES))
    register_lean_family("mistral", lambda config: "sliding window" if config.sliding_window else None)
    path = save_random_model(tmp_path / "mistral", "mistral", sliding_window=None, **SHAPE)
    model = load_model(str(path), torch.device("cpu")).eval()
    assert _same_as_transformers(model, tokenizer, SHARED)["lean_forwards"] > 0
    windowed = load_model(str(save_random_model(tmp_path / "w", "mistral", sliding_window=8, **SHAPE)),
                          torch.device("cpu"))  # fmt: skip
    assert _lean_of(windowed) is None
