"""The engine's forward pass for Llama-style models without transformers' module tree: the same arithmetic in
fewer, larger calls.

A decode step of 16 sequences of the default model took ~150 ms on 2 cores, of which the products were 41-46%;
the rest was transformers' layer code: per layer ~25 small operations, each reached through a module call,
hooks, keyword plumbing and mask checks. Here a layer is: the RMSNorm (`F.rms_norm`), one product for q, k and v
(their weights packed side by side), rotary embedding of q and k together, the slot cache write, attention
(cascade over the shared prefix, rollout/cascade.py), the o product, the RMSNorm, one product for gate and up,
SiLU times up in place, and the down product. The final norm and the output layer run on each row's last column
only. The products use the engine's packed copies (models/linear.py `PackedWeights.product`): the fused q/k/v
and gate/up copies replace the separate ones, so the packed weights take no more memory than before.

Families are kept in LEAN_FAMILIES by `config.model_type` (`register_lean_family` adds one from outside the
package); a model whose family is not there, whose layers are not the plain modules of that family (a LoRA
wrapper, a quantized or sharded weight, another activation), or whose attention is not full causal attention in
every layer runs transformers' forward as before (`LeanForward.of` says why at debug level). Values agree with
transformers' to float rounding: tests/rollout/test_lean.py compares logits and greedy tokens."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from toolrl.models.fused import FUSED_NORMS, _silu
from toolrl.models.fused import _plain_linear as _linear_forward
from toolrl.models.linear import PackedWeights, _plain
from toolrl.rollout.cascade import SharedPrefix, cascade, supports_cascade
from toolrl.rollout.slots import SlotCache

log = logging.getLogger(__name__)

LEAN_FAMILIES: dict[str, Callable[[object], str | None]] = {}
"""model_type -> a check of the config: None where the lean forward computes what transformers' does, else why
not."""


def register_lean_family(model_type: str, check: Callable[[object], str | None] | None = None) -> None:
    """Run models of `model_type` (decoder layers of self_attn q/k/v/o_proj, mlp gate/up/down_proj with SiLU, RMSNorms
    of weight * x / rms(x), no embedding scale) through the lean forward; `check(config)` may refuse a config."""
    LEAN_FAMILIES[model_type] = check or (lambda config: None)


def _llama(config) -> str | None:
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    return None


def _qwen2(config) -> str | None:
    return "sliding-window attention" if getattr(config, "use_sliding_window", False) else None


register_lean_family("llama", _llama)
register_lean_family("qwen2", _qwen2)


@dataclass
class _Layer:
    index: int
    attn_norm: torch.nn.Module
    post_norm: torch.nn.Module
    qkv: tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]
    o: torch.nn.Module
    gate_up: tuple[torch.nn.Module, torch.nn.Module]
    down: torch.nn.Module
    heads: int
    kv_heads: int
    head_dim: int
    scale: float


def _plain_linear(module) -> bool:
    """x @ weight^T + bias (models/fused.py's test: not a LoRA wrapper, not quantized) on fp32 CPU tensors."""
    return _linear_forward(module) and _plain(module.weight) and _plain(module.bias)


def _norm(module) -> bool:
    return type(module).__name__.removeprefix("Fused") in FUSED_NORMS and hasattr(module, "variance_epsilon")


class LeanForward:
    """One model's layers, read once per rollout (`of`); `__call__` is one forward pass of the engine."""

    def __init__(self, model, layers: list[_Layer], weights: PackedWeights):
        self.model = model
        self.weights = weights
        """The engine's packed copies, which the products read (`PackedWeights.product`)."""
        self.base = model.model
        self.layers = layers
        self.names = {id(m): n for n, m in model.named_modules()}

    @classmethod
    def of(cls, model, weights: PackedWeights) -> LeanForward | None:
        """The lean forward of `model` on the engine's `weights`, or None (logged at debug level, with why) where
        transformers' runs."""
        try:
            return cls(model, _read(model), weights)
        except _NotLean as exc:
            log.debug("lean forward not used: %s", exc)
            return None

    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: SlotCache,
        shared: SharedPrefix | None,
    ) -> torch.Tensor:
        """Feed `ids` [rows, width] at `positions` (position ids; the cache's `feed` says where they are written)
        with the additive `mask` [rows, 1, width, kv_len]; the float logits after each row's last column."""
        rows, width = ids.shape
        x = F.embedding(ids, self.base.embed_tokens.weight)
        cos, sin = self.base.rotary_emb(x, position_ids=positions)
        cos, sin = cos[:, :, None], sin[:, :, None]  # [rows, width, 1, head_dim]: every head alike
        # rotate_half(x) * sin = [-x2, x1] * [sin1, sin2] = [x2, x1] * [-sin1, sin2]: the halves swapped (a flip
        # of the pair dimension) times a sign-folded sine, computed once for every layer
        half = sin.shape[-1] // 2
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        for layer in self.layers:
            h = self._norm(x, layer.attn_norm)
            qkv = self._product(h, layer.qkv)
            q_and_k = (layer.heads + layer.kv_heads) * layer.head_dim
            qk = qkv[..., :q_and_k].unflatten(-1, (-1, layer.head_dim))
            qk = torch.addcmul(qk * cos, qk.unflatten(-1, (2, half)).flip(-2).flatten(-2), signed_sin)
            q, k = qk[:, :, : layer.heads], qk[:, :, layer.heads :]
            v = qkv[..., q_and_k:].unflatten(-1, (layer.kv_heads, layer.head_dim))
            # The cache takes [rows, kv_heads, width, dim] and returns each row's columns to attend to.
            keys, values = cache.layers[layer.index].update(k.transpose(1, 2), v.transpose(1, 2))
            query = q.transpose(1, 2)
            if shared is not None:
                out = cascade(query, keys, values, mask, layer.scale, shared, layer.index)
            else:
                out = F.scaled_dot_product_attention(
                    query, keys, values, attn_mask=mask, scale=layer.scale, enable_gqa=True
                ).transpose(1, 2)
            x.add_(self._product(out.reshape(rows, width, -1), (layer.o,)))  # x is this pass's own tensor
            gate_up = self._product(self._norm(x, layer.post_norm), layer.gate_up)
            inner = gate_up.shape[-1] // 2
            x.add_(self._product(F.silu(gate_up[..., :inner]).mul_(gate_up[..., inner:]), (layer.down,)))
        last = self._norm(x[:, -1], self.base.norm)
        return self._product(last, (self.model.lm_head,)).float()

    def _product(self, x: torch.Tensor, modules: tuple[torch.nn.Module, ...]) -> torch.Tensor:
        """x through the modules' weights side by side: one packed product where the engine's copies take x,
        else each module's own forward."""
        bias = None
        if modules[0].bias is not None:
            bias = modules[0].bias if len(modules) == 1 else torch.cat([m.bias for m in modules])
        name = "+".join(self.names[id(m)] for m in modules)
        out = self.weights.product(name, tuple(m.weight for m in modules), bias, x)
        if out is not None:
            return out
        return modules[0](x) if len(modules) == 1 else torch.cat([m(x) for m in modules], dim=-1)

    @staticmethod
    def _norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
        """transformers' weight * (x * rsqrt(mean(x^2) + eps)), computed in float32."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), norm.weight, eps=norm.variance_epsilon)
        return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)


class _NotLean(Exception):
    pass


def _read(model) -> list[_Layer]:
    """The layers' modules, checked: _NotLean says what does not fit."""
    config = getattr(model, "config", None)
    check = LEAN_FAMILIES.get(getattr(config, "model_type", None))
    if check is None:
        raise _NotLean(f"model_type {getattr(config, 'model_type', None)!r} is not in LEAN_FAMILIES")
    reason = check(config) or (None if supports_cascade(config) else "not full causal attention in every layer")
    if reason:
        raise _NotLean(reason)
    base = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    embed = getattr(base, "embed_tokens", None)
    if type(embed) is not torch.nn.Embedding or not _plain_linear(head) or not _norm(getattr(base, "norm", None)):
        raise _NotLean("the embedding, final norm or output layer is not the family's plain module")
    if getattr(config, "embedding_multiplier", None) or embed.max_norm is not None:
        raise _NotLean("a scaled or renormalized embedding")
    if not hasattr(base, "rotary_emb") or getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        raise _NotLean("no rotary embedding module, or rotary embedding of part of each head")
    layers = []
    for index, block in enumerate(base.layers):
        attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
        qkv = tuple(getattr(attn, f"{p}_proj", None) for p in "qkv")
        gate_up = (getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None))
        linears = (*qkv, getattr(attn, "o_proj", None), *gate_up, getattr(mlp, "down_proj", None))
        if not all(_plain_linear(m) for m in linears):
            raise _NotLean(f"layer {index}: a projection is not a plain fp32 linear layer (LoRA, quantized, sharded)")
        if len({m.bias is None for m in qkv}) > 1 or any(m.bias is not None for m in gate_up):
            raise _NotLean(f"layer {index}: biases on some projections only")
        if not (_norm(block.input_layernorm) and _norm(block.post_attention_layernorm) and _silu(mlp)):
            raise _NotLean(f"layer {index}: a norm or activation other than the family's RMSNorm and SiLU")
        if any(hasattr(attn, extra) for extra in ("q_norm", "k_norm", "sinks")):
            raise _NotLean(f"layer {index}: attention has query/key norms or sinks")
        heads = qkv[0].out_features // attn.head_dim
        kv_heads = qkv[1].out_features // attn.head_dim
        layers.append(_Layer(index, block.input_layernorm, block.post_attention_layernorm, qkv, attn.o_proj,
                             gate_up, mlp.down_proj, heads, kv_heads, attn.head_dim, attn.scaling))  # fmt: skip
    return layers
