"""Attention over a long prompt on CPU, forward and backward, with the native kernel (flash.c).

A step's shared prompt (5k tokens of tool schemas and instructions) goes through causal self-attention three
times a step: the rollout's prefill (scoring/rollout_prefix.py), and the update's replay and backward of it under
gradient checkpointing. At 4.9k tokens that attention is ~45% of the prompt's FLOPs, and PyTorch's CPU flash
kernels ran it at 40-55% of the machine's product rate, the backward at 135-185 GFLOP/s on the 2-core Xeon this
project measures on. flash.c runs the backward at 1.6-2x that and the forward at 1.1-1.3x
(bench/kernels/long_prompt_kernels.py).

`causal_attention` takes the place of SDPA where `takes` says so: fp32 on CPU, one sequence, no mask, as many keys
as queries (self-attention from position 0), at least MIN_TOKENS of them, a head size that is a multiple of the
kernel's column tile, and the library built (models/native/__init__.py; where it cannot be, SDPA as before, said
once in the log). The cascade's prefix part (every query sees every key of a shared prompt) runs on `prefix_forward`
and `prefix_backward` from MIN_PREFIX_QUERIES queries a head, and a decode step's few on `decode_forward`, over keys
packed once per rollout (`pack_keys`, kept on the rollout's SharedPrefix). ENABLED = False turns them all off (the
benchmarks' comparison)."""

from __future__ import annotations

import logging
from functools import cache

import torch

from toolrl.models import native

log = logging.getLogger(__name__)

ENABLED = True
MIN_TOKENS = 1024
"""Below this, SDPA: a short sequence's attention is a few percent of its step (and the kernel gains less)."""
MIN_PREFIX_QUERIES = 64


@cache
def _tile() -> int:
    """The kernel's column tile (the head size must be a multiple of it), or 0 where it cannot be built here."""
    try:
        return native.load().toolrl_flash_tile()
    except native.KernelUnavailable as exc:
        log.warning("long-prompt attention keeps PyTorch's SDPA: %s", exc)
        return 0


def takes(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask,
    dropout: float,
    kwargs: dict,
) -> bool:
    """Whether `causal_attention` computes this SDPA call ([1, heads, n, d] queries and [1, kv_heads, n, d] keys)."""
    n, dim = query.shape[2], query.shape[3]
    plain = not any(kwargs.get(name) is not None for name in ("softcap", "sliding_window", "position_bias"))
    return (
        ENABLED
        and plain
        and mask is None
        and not dropout
        and kwargs.get("is_causal", True) is not False
        and getattr(module, "is_causal", True)
        and query.device.type == "cpu"
        and query.dtype == torch.float32
        and query.shape[0] == 1
        and key.shape[2] == n >= MIN_TOKENS
        and query.shape[1] % key.shape[1] == 0
        and query.stride(3) == key.stride(3) == value.stride(3) == 1
        and bool(_tile())
        and dim % _tile() == 0
    )


def takes_prefix(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether `prefix_forward`/`prefix_backward` compute attention of `query` [1, heads, m, d] over every key of
    `key` [1, heads, n, d] (a cascade's shared prefix: scoring/cascade_grad.py), not PyTorch's flash kernel: the same
    conditions as `takes`, with at least MIN_PREFIX_QUERIES queries a head (a decode step's few stay on PyTorch's)."""
    return (
        ENABLED
        and query.device.type == key.device.type == "cpu"
        and query.dtype == key.dtype == torch.float32
        and query.shape[0] == key.shape[0] == 1
        and query.shape[1] == key.shape[1]
        and query.shape[2] >= MIN_PREFIX_QUERIES
        and key.shape[2] >= MIN_TOKENS
        and bool(_tile())
        and query.shape[3] % _tile() == 0
    )


def takes_decode(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether `decode_forward` computes attention of `query` [1, heads, m, d] over every key of `key` [1, kv_heads,
    n, d]: a decode step's few queries a head (fewer than MIN_PREFIX_QUERIES) over a long shared prefix, without
    gradients (the prefix's keys packed once for all the steps that read them: `pack_keys`)."""
    return (
        ENABLED
        and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad))
        and query.device.type == key.device.type == "cpu"
        and query.dtype == key.dtype == torch.float32
        and query.shape[0] == key.shape[0] == 1
        and query.shape[1] % key.shape[1] == 0
        and query.shape[2] < MIN_PREFIX_QUERIES
        and key.shape[2] >= MIN_TOKENS
        and bool(_tile())
        and query.shape[3] % _tile() == 0
        and query.stride(3) == key.stride(3) == 1
    )


def _packed_floats(lib, kv_heads: int, n: int, dim: int) -> int:
    """The size of `pack_keys`' result for n keys: whole blocks of keys, zero past n."""
    block = lib.toolrl_flash_key_block()
    return kv_heads * -(-n // block) * dim * block


def pack_keys(key: torch.Tensor) -> torch.Tensor:
    """`key` [1, kv_heads, n, d] as `decode_forward` reads it: each block of keys transposed (flash.c)."""
    lib = native.load()
    _, kv_heads, n, dim = key.shape
    packed = torch.empty(_packed_floats(lib, kv_heads, n, dim))
    lib.toolrl_flash_pack_keys(*_views(_readable(key[0])), kv_heads, n, dim, packed.data_ptr(), torch.get_num_threads())
    return packed


def decode_forward(query, packed_keys, value, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `query` [1, heads, m, d] over every key (`pack_keys`' of [1, kv_heads, n, d]) and `value`
    [1, kv_heads, n, d]: output [1, heads, m, d] and log-sum-exp [1, heads, m], as `prefix_forward` returns them."""
    query, value = _readable(query[0]), _readable(value[0])
    (heads, m, dim), (kv_heads, n, _) = query.shape, value.shape
    lib = native.load()
    size = _packed_floats(lib, kv_heads, n, dim)
    if packed_keys.numel() != size or packed_keys.dtype != torch.float32 or not packed_keys.is_contiguous():
        raise ValueError(f"decode_forward: packed keys of {packed_keys.numel()} floats are not pack_keys' of {n} keys")
    out, lse = torch.empty(query.shape), torch.empty(heads, m)
    code = lib.toolrl_flash_decode(
        *_views(query), packed_keys.data_ptr(), *_views(value), heads, kv_heads, m, n, dim, scale, out.data_ptr(),
        out.stride(0), out.stride(1), lse.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if code != 0:
        raise RuntimeError(f"toolrl_flash_decode failed on {heads} heads x {m} x {n} keys x {dim} (out of memory?)")
    return out[None], lse[None]


def _views(*tensors: torch.Tensor) -> list[int]:
    """Each [heads, n, d] tensor (last dimension contiguous) as the kernel reads it: data, head stride, token
    stride."""
    return [x for t in tensors for x in (t.data_ptr(), t.stride(0), t.stride(1))]


def _readable(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _forward(query, key, value, offset: int, scale: float, out: torch.Tensor) -> torch.Tensor:
    """Attention of `query` [heads, m, d] (query i at position offset + i) over `key`/`value` [kv_heads, n, d] into
    `out` ([heads, m, d] strides, written); returns the log-sum-exp [heads, m]."""
    (heads, m, dim), n = query.shape, key.shape[1]
    lse = torch.empty(heads, m)
    code = native.load().toolrl_flash_forward(
        *_views(query, key, value), heads, key.shape[0], m, n, offset, dim, scale, out.data_ptr(), out.stride(0),
        out.stride(1), lse.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if code != 0:
        raise RuntimeError(f"toolrl_flash_forward failed on {heads} heads x {m} x {n} tokens x {dim} (out of memory?)")
    return lse


def _backward(d_out, query, key, value, out, lse, offset: int, scale: float):
    """The gradients of `_forward`'s query, key and value ([heads, m, d], [kv_heads, n, d] x 2, contiguous) from
    `d_out` and `out` ([heads, m, d] views)."""
    (heads, m, dim), n = query.shape, key.shape[1]
    # contiguous: the kernel reads them a block of rows at a time, many times over (1.1x measured at 4.9k tokens)
    query, key, d_out = query.contiguous(), key.contiguous(), d_out.contiguous()
    delta = (d_out * out).sum(-1)
    dq, dk, dv = torch.empty(heads, m, dim), torch.empty(*key.shape), torch.empty(*value.shape)
    code = native.load().toolrl_flash_backward(
        *_views(query, key, value, d_out), lse.data_ptr(), delta.data_ptr(), heads, key.shape[0], m, n, offset, dim,
        scale, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if code != 0:
        raise RuntimeError(f"toolrl_flash_backward failed on {heads} heads x {m} x {n} tokens x {dim} (out of memory?)")
    return dq, dk, dv


class _Causal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, scale):
        heads, n, dim = query.shape
        out = torch.empty(n, heads, dim)  # the layout attention modules expect back
        lse = _forward(query, key, value, 0, scale, out.transpose(0, 1))
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        query, key, value, out, lse = ctx.saved_tensors
        grads = _backward(d_out.transpose(0, 1), query, key, value, out.transpose(0, 1), lse, 0, ctx.scale)
        return *grads, None


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal self-attention of `query` [1, heads, n, d] over `key`/`value` [1, kv_heads, n, d] (query head h reads
    KV head h // (heads / kv_heads)), differentiable in all three. Returns [1, n, heads, d], the layout attention
    modules expect back."""
    return _Causal.apply(query[0], key[0], value[0], scale)[None]


def prefix_forward(query, key, value, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `query` [1, heads, m, d] over every key of `key`/`value` [1, heads, n, d] (not differentiable:
    scoring/cascade_grad.py's backward calls `prefix_backward`): output [1, heads, m, d] and log-sum-exp [1, heads, m],
    as PyTorch's CPU flash kernel returns them."""
    query, key, value = (_readable(x[0]) for x in (query, key, value))
    out = torch.empty(query.shape)
    lse = _forward(query, key, value, key.shape[1], scale, out)
    return out[None], lse[None]


def prefix_backward(d_out, query, key, value, out, lse, scale: float):
    """The gradients of `prefix_forward`'s query, key and value ([1, ...] each) from `d_out` and its `out` and
    `lse`."""
    query, key, value = (_readable(x[0]) for x in (query, key, value))
    grads = _backward(d_out[0], query, key, value, out[0], lse[0].contiguous(), key.shape[1], scale)
    return tuple(g[None] for g in grads)
