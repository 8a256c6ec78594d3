"""Packed oneDNN weights for generation (models/linear.py PackedWeights): the same products as the plain layer,
used only without autograd and only while active, packed again when the weight changes, freed on clear."""

import asyncio

import pytest
import torch

from toolrl.models.linear import PackedWeights, onednn_available, use_onednn_linear
from toolrl.rollout import HFEngine, SamplingParams

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN")


def layers(bias: bool = False) -> torch.nn.Sequential:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(576, 1536, bias=bias), torch.nn.Linear(1536, 192, bias=bias))
    assert use_onednn_linear(model) == 2
    return model


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 8, 32, 405])
def test_packed_products_equal_the_plain_layers(rows, bias):
    model, x = layers(bias), torch.randn(rows, 576)
    packed = PackedWeights(model)
    with torch.inference_mode():
        plain = model(x)
        with packed.active():
            assert all(layer.packed is not None for layer in model)
            fast = model(x)
    assert packed.packs == 2 and packed.peak_bytes == sum(layer.weight.numel() * 4 for layer in model)
    assert torch.allclose(fast, plain, rtol=1e-5, atol=1e-5)
    assert all(layer.packed is None for layer in model)  # outside active() the layers are plain again


def test_a_changed_weight_is_packed_again_and_an_unchanged_one_is_not():
    model, x = layers(), torch.randn(32, 576)
    packed = PackedWeights(model)
    with torch.inference_mode(), packed.active():
        model(x)
    assert packed.packs == 2
    with torch.inference_mode(), packed.active():
        model(x)
    assert packed.packs == 2  # nothing changed: the copies are reused
    optimizer = torch.optim.AdamW(model[0].parameters(), lr=0.1)
    model[0](x).sum().backward()
    optimizer.step()
    with torch.inference_mode():
        expect = model(x)
        with packed.active():
            got = model(x)
    assert packed.packs == 3  # only the stepped layer is packed again
    assert torch.allclose(got, expect, rtol=1e-5, atol=1e-5)
    model[1].weight.data = torch.randn(192, 1536)  # a new tensor in place of the weight (a weight sync)
    with torch.inference_mode():
        expect = model(x)
        with packed.active():
            got = model(x)
    assert packed.packs == 4 and torch.allclose(got, expect, rtol=1e-5, atol=1e-5)
    packed.clear()
    with torch.inference_mode(), packed.active():
        model(x)
    assert packed.packs == 6  # cleared copies are made again on the next use


def test_training_inside_active_uses_the_parameters_and_gets_their_gradients():
    model, x = layers(), torch.randn(32, 576)
    reference = layers()
    packed = PackedWeights(model)
    with packed.active():
        model(x).square().sum().backward()
    reference(x).square().sum().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(ours.grad, theirs.grad, rtol=1e-5, atol=1e-4)


def test_the_engine_samples_from_the_current_weights_and_frees_its_copies(tiny_model_dir, tokenizer):
    """The engine packs on its first step and again after an optimizer step between rollouts; its log-probs
    are a plain forward pass's both times; free_memory drops the copies."""
    from toolrl.models import load_model

    model = load_model(str(tiny_model_dir), torch.device("cpu")).eval()
    engine = HFEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    prompts = [list(range(1000, 1040)) + [2000 + i] for i in range(8)]

    def rollout():
        async def run():
            params = SamplingParams(temperature=1.0, max_new_tokens=4)
            return await asyncio.gather(*(engine.generate(i, p, params) for i, p in enumerate(prompts)))

        outs = asyncio.run(run())
        for i in range(len(prompts)):
            engine.release(i)
        engine.free_memory()
        return outs

    def plain_logprobs(prompt, ids):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0]
        lp = torch.log_softmax(logits.float(), -1)
        return [float(lp[len(prompt) + i - 1, t]) for i, t in enumerate(ids)]

    for _ in range(2):
        outs = rollout()
        assert engine.packed.packs > 0 and not engine.packed._copies  # packed during the rollout, freed after
        for prompt, out in zip(prompts, outs, strict=True):
            assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(plain_logprobs(prompt, out.ids)), atol=1e-4)
        with torch.no_grad():
            model.lm_head.weight.mul_(1.5)  # an optimizer step's in-place change, tied to the embedding
