"""RMSNorm and the SwiGLU feed-forward as one autograd step each (toolrl.models.fused): transformers' values and
gradients, full and LoRA, in float32 and bfloat16, with fewer activations kept for the backward pass; a run's
trained model uses them unless `model.fused_blocks: false`."""

import copy

import pytest
import torch

from toolrl.config import load_config
from toolrl.models import load_model
from toolrl.models.fused import FusedMLP, FusedRMSNorm, use_fused_blocks, use_unfused_blocks


def kinds(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for module in model.modules():
        for mixin in (FusedRMSNorm, FusedMLP):
            if isinstance(module, mixin):
                counts[mixin.__name__] = counts.get(mixin.__name__, 0) + 1
    return counts


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def saved_bytes(model, ids) -> int:
    """Bytes the decoder's forward pass keeps for the backward pass, parameters not counted (the output layer,
    whose logits dominate at the tiny model's size, left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model.model(input_ids=ids).last_hidden_state.pow(2).mean()
    loss.backward()
    return sum(kept.values())


@pytest.mark.parametrize("cpu_linear", ["onednn", "torch"])
def test_a_model_trains_as_with_transformers_modules_and_keeps_less(tiny_model_dir, cpu_linear):
    reference = load_model(str(tiny_model_dir), torch.device("cpu"), cpu_linear=cpu_linear)
    ours = copy.deepcopy(reference)
    layers = reference.config.num_hidden_layers
    assert use_fused_blocks(ours) == 3 * layers + 1  # two norms and a feed-forward a layer, and the final norm
    assert kinds(ours) == {"FusedRMSNorm": 2 * layers + 1, "FusedMLP": layers}
    ids = torch.randint(0, 1000, (2, 24))
    with torch.no_grad():  # generation's path: exactly transformers' ops
        assert torch.equal(ours(input_ids=ids).logits, reference(input_ids=ids).logits)
    (loss, grads), (loss_ours, grads_ours) = loss_and_grads(reference, ids), loss_and_grads(ours, ids)
    assert torch.equal(loss_ours, loss)  # the forward runs the same ops in the same order
    assert grads_ours.keys() == grads.keys() and len(grads) == len(list(reference.parameters()))
    for name in grads:
        torch.testing.assert_close(grads_ours[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # per token and layer: a norm's normalized copy (x2), silu(gate) and the product no longer kept
    assert saved_bytes(ours, ids) < 0.7 * saved_bytes(reference, ids)
    assert ours.state_dict().keys() == reference.state_dict().keys()


def test_under_lora_the_wrapped_down_projection_still_gets_its_gradients(tiny_model_dir):
    from toolrl.config.schema import LoRAConfig
    from toolrl.models.policy import apply_lora

    models = []
    for fused in (False, True):
        model = load_model(str(tiny_model_dir), torch.device("cpu"))
        if fused:
            use_fused_blocks(model)
        torch.manual_seed(0)  # LoRA's initialisation
        models.append(apply_lora(model, LoRAConfig(r=4, target_modules=["q_proj", "up_proj", "down_proj"])))
    for module in models[1].modules():  # lora_B starts at zero: give the adapters a value to differentiate
        if hasattr(module, "lora_B"):
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.02)
    models[0].load_state_dict(models[1].state_dict())
    ids = torch.randint(0, 1000, (2, 16))
    (loss, grads), (loss_ours, grads_ours) = (loss_and_grads(m, ids) for m in models)
    torch.testing.assert_close(loss_ours, loss, rtol=1e-6, atol=1e-6)
    assert grads_ours.keys() == grads.keys() and any("down_proj.lora_A" in n for n in grads)
    for name in grads:
        torch.testing.assert_close(grads_ours[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_bfloat16_gradients_are_as_close_to_float32s_as_transformers_own(tiny_model_dir):
    """In bfloat16 the fused backward computes in float32 where transformers' ops round at every step: its
    gradients are at least as close to the float32 ones (the same weights) as transformers' are."""
    reference = load_model(str(tiny_model_dir), torch.device("cpu"), dtype="bfloat16")
    ours = copy.deepcopy(reference)
    use_fused_blocks(ours)
    exact = copy.deepcopy(reference).float()
    ids = torch.randint(0, 1000, (1, 12))
    (loss, grads), (loss_ours, grads_ours) = loss_and_grads(reference, ids), loss_and_grads(ours, ids)
    _, grads_exact = loss_and_grads(exact, ids)
    assert torch.equal(loss_ours, loss)  # the forward: transformers' ops and casts
    for name, expected in grads_exact.items():
        assert grads_ours[name].dtype == torch.bfloat16
        error = (grads[name].float() - expected).norm()
        error_ours = (grads_ours[name].float() - expected).norm()
        assert error_ours <= 1.2 * error + 1e-3 * expected.norm(), name


def test_only_the_llama_formula_is_switched_and_undone(tiny_model_dir):
    """A norm of another formula (Gemma's 1 + weight) or a feed-forward with another activation keeps its own
    forward; use_unfused_blocks gives transformers' classes back."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    gelu_config = copy.deepcopy(model.config)
    gelu_config.hidden_act = "gelu"
    extra = torch.nn.ModuleList([GemmaRMSNorm(8), LlamaMLP(gelu_config)])
    assert use_fused_blocks(extra) == 0
    assert [type(m) for m in extra] == [GemmaRMSNorm, LlamaMLP]
    switched = use_fused_blocks(model)
    assert use_unfused_blocks(model) == switched and not kinds(model)
    assert {type(m) for m in model.modules()} >= {LlamaRMSNorm, LlamaMLP}


def test_a_norms_gradient_matches_at_any_shape_and_scale():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    reference = LlamaRMSNorm(48, eps=1e-5)
    torch.nn.init.normal_(reference.weight, mean=1.0, std=0.3)
    ours = copy.deepcopy(reference)
    use_fused_blocks(ours)
    for shape, scale in (((3, 48), 1.0), ((2, 5, 48), 30.0), ((1, 1, 48), 1e-3)):
        x = (torch.randn(shape) * scale).requires_grad_(True)
        x_ours = x.detach().clone().requires_grad_(True)
        out, out_ours = reference(x), ours(x_ours)
        grad = torch.randn_like(out)
        out.backward(grad)
        out_ours.backward(grad)
        torch.testing.assert_close(x_ours.grad, x.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.weight.grad, reference.weight.grad, rtol=1e-5, atol=1e-5)
        reference.zero_grad()
        ours.zero_grad()


def test_a_run_trains_fused_unless_the_config_says_not(tiny_model_dir):
    from toolrl.train.workbench import Workbench

    overrides = [f"model.name={tiny_model_dir}", "device=cpu"]
    bench = Workbench.load(load_config(overrides=overrides))
    assert kinds(bench.model)["FusedMLP"] == bench.model.config.num_hidden_layers
    plain = Workbench.load(load_config(overrides=[*overrides, "model.fused_blocks=false"]))
    assert not kinds(plain.model)


def test_the_native_swiglu_pass_gives_pytorchs_values_and_is_what_the_backward_uses(monkeypatch):
    """The feed-forward's backward computes the product and both gradients in one native pass where the library is
    built (models/native/elementwise.c): PyTorch's values, at any scale of gate (sigmoid's tails) and at a length
    that is no multiple of a vector; without it, the PyTorch ops."""
    from toolrl.models import fused, native

    try:
        native.load()
    except native.KernelUnavailable as exc:
        pytest.skip(f"the native library cannot be built here: {exc}")
    generator = torch.Generator().manual_seed(0)
    gate = torch.randn(3, 37, 101, generator=generator) * torch.tensor([1.0, 10.0, 100.0])[:, None, None]
    up, grad = torch.randn(3, 37, 101, generator=generator), torch.randn(3, 37, 101, generator=generator)
    product, grad_gate, grad_up = fused._native_swiglu(grad, gate, up, (True, True, True))
    sig = torch.sigmoid(gate)
    torch.testing.assert_close(product, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_up, grad * gate * sig, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_gate, grad * up * sig * (1 + gate * (1 - sig)), rtol=1e-5, atol=1e-5)
    assert fused._native_swiglu(grad, gate, up, (False, True, False))[::2] == [None, None]  # only what is asked
    assert fused._native_swiglu(grad.double(), gate.double(), up.double(), (True, True, True)) is None

    calls = []
    real = fused._native_swiglu
    monkeypatch.setattr(fused, "_native_swiglu", lambda *a: calls.append(a[3]) or real(*a))
    weight = torch.randn(5, 101, requires_grad=True)
    gate.requires_grad_(), up.requires_grad_()
    fused._SwiGLUDown.apply(gate, up, weight, None).sum().backward()
    assert calls == [(True, True, True)]
    want = [t.grad.clone() for t in (gate, up, weight)]
    monkeypatch.setattr(fused, "_native_swiglu", lambda *a: None)  # the PyTorch ops
    for t in (gate, up, weight):
        t.grad = None
    fused._SwiGLUDown.apply(gate, up, weight, None).sum().backward()
    for got, t in zip(want, (gate, up, weight), strict=True):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-5)
