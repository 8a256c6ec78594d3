"""Packed rows (train/packed.py): a micro-batch's suffixes go through the linear layers as one sequence of their real
tokens, not padded to the longest; the scores and gradients are the padded layout's."""

import copy

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import toolrl.train.logprobs as logprobs
from tests.train.test_logprobs import make_traj
from toolrl.config.schema import LoRAConfig
from toolrl.models.policy import apply_lora
from toolrl.train.logprobs import StepPrefix, micro_batches, score_tokens, trained_token_logprobs


def group(shared):
    """Rows of 3, 9 and 17 tokens after `shared`: padded, most of the first two rows would be padding."""
    return [
        make_traj(shared + [50], [("model", [60, 61]),]),
        make_traj(shared + [52, 53], [("model", [63, 64, 65]), ("obs", [70, 71]), ("model", [80, 81])]),
        make_traj(shared + [54], [("model", list(range(90, 98))), ("obs", [72, 73]), ("model", list(range(100, 106)))]),
    ]  # fmt: skip


def scores_and_grads(model, trajs, packed: bool, monkeypatch, **kwargs):
    with monkeypatch.context() as patch:
        if not packed:
            patch.setattr(logprobs, "packable", lambda model: False)
        model.zero_grad()
        scores = score_tokens(model, trajs, 0.9, **kwargs)
        scores.logprobs.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return scores.logprobs.detach(), grads


def assert_same(packed, padded):
    assert torch.allclose(packed[0], padded[0], atol=1e-5)
    assert packed[1].keys() == padded[1].keys() and packed[1]
    for name, grad in padded[1].items():
        assert (packed[1][name] - grad).norm() <= 1e-4 * grad.norm() + 1e-7, name


@pytest.mark.parametrize("shared", [list(range(10, 30)), []], ids=["shared-prefix", "no-prefix"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_packed_rows_score_and_train_as_padded_rows(tiny_model, shared, checkpointing, monkeypatch):
    model = copy.deepcopy(tiny_model).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    trajs = (
        group(shared)
        if shared
        else [  # prompts that differ from their first token: nothing shared
            make_traj([11, 12], [("model", [60, 61])]),
            make_traj([13], [("model", list(range(70, 82)))]),
            make_traj([14, 15, 16], [("model", [63]), ("obs", [71]), ("model", [80, 81, 82])]),
        ]
    )
    assert_same(scores_and_grads(model, trajs, True, monkeypatch), scores_and_grads(model, trajs, False, monkeypatch))


def test_the_linear_layers_see_only_real_tokens(tiny_model, monkeypatch):
    """The point of packing: the MLP of every layer computes the rows' real tokens (3 + 9 + 17 here), not rows x the
    longest (3 x 17)."""
    model = copy.deepcopy(tiny_model)
    trajs = group(list(range(10, 30)))
    suffixes = [len(t.token_ids) - 20 for t in trajs]
    seen = []
    hook = model.model.layers[0].mlp.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[:-1].numel()))
    with torch.no_grad():
        trained_token_logprobs(model, trajs)
        monkeypatch.setattr(logprobs, "packable", lambda model: False)
        trained_token_logprobs(model, trajs)
    hook.remove()
    prefix_pass = 20
    assert seen == [prefix_pass, sum(suffixes), prefix_pass, len(trajs) * max(suffixes)]
    assert sum(suffixes) < 0.6 * len(trajs) * max(suffixes)


def test_a_step_prefix_over_micro_batches_and_lora_adapters_train_as_padded(tiny_model, monkeypatch):
    """The step's shared prompt computed once (StepPrefix) for two packed micro-batches, LoRA adapters on."""
    model = apply_lora(copy.deepcopy(tiny_model), LoRAConfig(r=4, alpha=8.0)).train()
    trajs = group(list(range(10, 30))) + group(list(range(10, 30)))[::-1]
    batches = micro_batches([len(t.token_ids) - 20 for t in trajs], max_tokens=40)
    assert len(batches) >= 2 and any(len({len(trajs[i].token_ids) for i in b}) > 1 for b in batches)

    def run(packed):
        with monkeypatch.context() as patch:
            if not packed:
                patch.setattr(logprobs, "packable", lambda model: False)
            model.zero_grad()
            prefix = StepPrefix.of(model, trajs, batches)
            assert prefix is not None
            out = []
            for rows in batches:
                scores = score_tokens(model, [trajs[i] for i in rows], 1.0, step_prefix=prefix)
                scores.logprobs.sum().backward()
                out.append(scores.logprobs.detach())
            prefix.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return torch.cat(out), grads

    packed, padded = run(True), run(False)
    assert all("lora" in name for name in packed[1])
    assert_same(packed, padded)


def test_a_model_whose_attention_drops_the_packed_layout_fails_loudly(tiny_model, monkeypatch):
    """Attention that does not pass keyword arguments on would attend across rows silently: refused instead."""
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", sdpa_attention_forward)
    with pytest.raises(RuntimeError, match="packed rows: 0 of 2 attention layers"):
        trained_token_logprobs(tiny_model, group(list(range(10, 30))))
