"""fp32 linear layers on CPU through oneDNN, PyTorch's own CPU kernel library, instead of the BLAS that
`torch.nn.functional.linear` calls (MKL in the pip CPU build).

MKL picks its fast code paths by CPU vendor: on the AMD EPYC this project measures on (2 threads) it ran a
16 x 576 x 1536 product at 126 GFLOP/s where oneDNN ran it at 255, and a training step's 4096-row products at
225 against 494 (bench/kernels/linear_kernels.py). The same arithmetic in another order: results agree to fp32
rounding (a loss to 2e-6, gradients to 6e-6 relative). Small products keep torch's kernel, where oneDNN's fixed
cost per call is larger than the work (a decode step of one sequence through a 576 x 192 projection).

`use_onednn_linear(model)` switches a model's `nn.Linear` layers in place (their class, not their parameters:
state dicts, LoRA wrapping, tied weights and checkpoints are unchanged); `model.cpu_linear: torch` in a config
keeps torch's kernels.

For generation, `PackedWeights` keeps a copy of each weight in oneDNN's own blocked layout, which oneDNN
otherwise rearranges at every call: a decode step of 32 sequences through 576 x 1536 took 248 us instead of 310
(1 thread; the same products, bit-identical results). The copies follow the weights: one whose weight changed
(an optimizer step, a weight sync) is packed again before its next use."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import cache

import torch
import torch.nn.functional as F

from toolrl.models.native import NativeWeight, cpuinfo, max_rows

log = logging.getLogger(__name__)

MIN_WORK = 4_000_000
"""Rows x in-features x out-features below which a product stays on torch's kernel: measured here, oneDNN
loses below about this much work (one row through 576 x 576) and wins from about twice it."""
PACKED_MIN_WORK = 800_000
"""The same with the weight packed: oneDNN ties torch at 4 rows x 576 x 192 and one row x 576 x 1536, and wins
above (8 rows x 576 x 192: 19 us against 24)."""


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def matmul_gflops(n: int = 1024, seconds: float = 0.25, least: int = 5) -> float:
    """This machine's fp32 matmul rate now (GFLOP/s): the fastest n x n product on torch's kernel and on oneDNN's,
    each repeated for `seconds` (at least `least` times) after a first, unmeasured one. Three products were not
    enough: the first few after a pause run slow (threads waking), and a best of three on the EPYC came out at
    85-156 GFLOP/s where twenty gave 182-192."""
    import time

    a, b = torch.randn(n, n), torch.randn(n, n)
    kernels = [lambda: a @ b]
    if onednn_available():
        kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))
    best = float("inf")
    for product in kernels:
        product()
        ends, count = time.perf_counter() + seconds / len(kernels), 0
        while count < least or time.perf_counter() < ends:
            started = time.perf_counter()
            product()
            best, count = min(best, time.perf_counter() - started), count + 1
    return 2 * n**3 / best / 1e9


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T + bias, rows flattened for oneDNN and shaped back (a transposed weight
    view is read as it is: no copy)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.shape[0])


@cache
def _mkl_full_speed() -> bool:
    """Whether MKL runs its own fast code here: on Intel CPUs (it chooses its code paths by vendor)."""
    return "GenuineIntel" in cpuinfo()


def weight_grad(grad_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
    """A linear layer's weight gradient, grad_rows^T [out, rows] @ x_rows [rows, in]. oneDNN reads an input only
    in rows, so grad_rows^T is copied first (a transposing copy of the whole gradient: 30 MB for a 4.9k-token
    prompt's MLP); MKL reads it transposed as it is. On an Intel CPU MKL's product is the faster (4.9k rows through
    576 x 1536: 48 ms against oneDNN's 108 with the copy, bench/kernels/long_prompt_kernels.py); elsewhere oneDNN's
    (MKL's generic code on the AMD EPYC ran the forward's products at half oneDNN's rate)."""
    if _mkl_full_speed() and _plain(grad_rows) and _plain(x_rows):
        return torch.mm(grad_rows.t(), x_rows)
    return linear(grad_rows.t(), x_rows.t())


def _pays(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether x @ weight^T + bias goes to oneDNN: dense fp32 CPU tensors and at least MIN_WORK multiply-adds."""
    return x.numel() * weight.shape[0] >= MIN_WORK and _plain(x) and _plain(weight) and _plain(bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` without autograd, on oneDNN where it pays (fp32 CPU tensors, at least
    MIN_WORK): for code that computes its own gradients (the output layer's blocked log-probs)."""
    return _onednn(x, weight, bias) if _pays(x, weight, bias) else F.linear(x, weight, bias)


class _LinearFunction(torch.autograd.Function):
    """A linear layer whose forward and both gradients are oneDNN products."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1]).contiguous()
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn(grad, weight.t(), None)  # grad [.., out] @ weight [out, in]
        if ctx.needs_input_grad[1]:  # grad^T [out, rows] @ x [rows, in]
            grad_weight = weight_grad(rows, x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(0)
        return grad_x, grad_weight, grad_bias


def _pays_packed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return x.numel() * weight.shape[0] >= PACKED_MIN_WORK and _plain(x) and _plain(bias)


def _plain(tensor: torch.Tensor | None) -> bool:
    """A dense CPU fp32 tensor (not a DTensor shard, not a quantized or meta tensor)."""
    return tensor is None or (
        type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.dtype == torch.float32 and tensor.is_cpu
    )


class OneDNNLinear(torch.nn.Linear):
    """`nn.Linear` whose products of at least MIN_WORK run on oneDNN (fp32, CPU; anything else: torch's)."""

    packed: torch.Tensor | NativeWeight | None = None
    """The weight in oneDNN's layout, or the small-batch kernel's (models/native), while a `PackedWeights` is
    active (inference only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        packed = self.packed
        if packed is not None and not torch.is_grad_enabled():
            if isinstance(packed, NativeWeight):  # the small-batch kernel's layout (models/native)
                if packed.takes(x) and _plain(bias):
                    return packed(x, bias)
            elif _pays_packed(x, weight, bias):
                return _onednn(x, packed, bias)
        if not _pays(x, weight, bias):
            return F.linear(x, weight, bias)
        trained = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        if torch.is_grad_enabled() and trained:
            return _LinearFunction.apply(x, weight, bias)
        return _onednn(x, weight, bias)


def use_onednn_linear(model: torch.nn.Module) -> int:
    """Switch the model's fp32 CPU `nn.Linear` layers to OneDNNLinear in place; how many were switched (0
    where this PyTorch has no oneDNN)."""
    if not onednn_available():
        log.info("oneDNN is not available in this PyTorch: linear layers keep torch's kernels")
        return 0
    switched = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and _plain(module.weight):
            module.__class__ = OneDNNLinear
            switched += 1
    return switched


def use_torch_linear(model: torch.nn.Module) -> int:
    """Undo use_onednn_linear: the layers run torch's kernels again; how many were switched back."""
    switched = 0
    for module in model.modules():
        if type(module) is OneDNNLinear:
            module.__class__ = torch.nn.Linear
            switched += 1
    return switched


def weight_version(tensor: torch.Tensor) -> tuple[int, int]:
    """What changes when a weight does: its storage, or its in-place version counter (optimizer steps,
    `load_state_dict`, weight syncs)."""
    return tensor.data_ptr(), tensor._version


def weights_key(model: torch.nn.Module) -> frozenset:
    """Changes whenever any parameter of `model` does (weight_version of each); a parameter and an alias of it (the
    same storage: embedding_grad.py's, while an update runs) count once."""
    return frozenset(weight_version(p) for p in model.parameters())


class PackedWeights:
    """oneDNN-layout copies of a model's OneDNNLinear weights, used by their forward passes without autograd
    inside `active()` (an inference engine's steps). A copy is made on first use and made again when its weight
    has changed since (its storage or its in-place version counter: optimizer steps, `load_state_dict`, weight
    syncs). The copies cost the linear weights' memory once more; `clear()` frees them (between rollouts).

    With `native` (models/native: `model.cpu_decode_kernel`), the copies are in the small-batch kernel's layout
    instead: products of at most its max_rows() rows (decode steps) run on it, larger ones (prefills) on oneDNN
    from the plain weight.

    `product` serves callers without modules (rollout/lean.py): one copy of several layers' weights side by side
    (q, k and v; gate and up), held under the joined names and made again when any of them changes."""

    def __init__(self, model: torch.nn.Module, native: bool = False):
        self.model = model
        self.native = native
        self._copies: dict[str, tuple[tuple, torch.Tensor]] = {}
        self.packs = 0
        """How many copies were made (first packs and re-packs after a weight changed)."""
        self.peak_bytes = 0
        """The most bytes the copies held at once."""

    @contextmanager
    def active(self):
        layers = [(n, m) for n, m in self.model.named_modules() if type(m) is OneDNNLinear and _plain(m.weight)]
        for name, layer in layers:
            layer.packed = self._copy(name, layer.weight)
        try:
            yield
        finally:
            for _, layer in layers:
                layer.packed = None

    def product(
        self, name: str, weights: tuple[torch.Tensor, ...], bias: torch.Tensor | None, x: torch.Tensor
    ) -> torch.Tensor | None:
        """x @ cat(weights)^T + bias from the copy held under `name` (made on first use: the weights side by side,
        one product for several layers that read the same input), or None where no copy takes x (the caller
        runs the layers' own forwards). Inference only (rollout/lean.py)."""
        if torch.is_grad_enabled() or not (_plain(x) and _plain(bias) and all(_plain(w) for w in weights)):
            return None
        if self.native:
            if x.numel() > max_rows() * x.shape[-1]:
                return None
            return self._copy(name, *weights)(x, bias)
        if x.numel() * sum(w.shape[0] for w in weights) < PACKED_MIN_WORK:
            return None
        return _onednn(x, self._copy(name, *weights), bias)

    def _copy(self, name: str, *weights: torch.Tensor) -> torch.Tensor | NativeWeight:
        key = tuple((*weight_version(w), tuple(w.shape)) for w in weights)
        held = self._copies.get(name)
        if held is None or held[0] != key:
            with torch.inference_mode():
                weight = weights[0].detach() if len(weights) == 1 else torch.cat([w.detach() for w in weights])
                copy = NativeWeight(weight) if self.native else torch.ops.mkldnn._reorder_linear_weight(weight)
                del weight
            held = (key, copy)
            self._copies[name] = held
            self.packs += 1
            held_bytes = sum(copy.nbytes for _, copy in self._copies.values())
            self.peak_bytes = max(self.peak_bytes, held_bytes)
        return held[1]

    def clear(self) -> None:
        self._copies.clear()
