"""Cascade attention with a backward pass, for the update's suffix pass on CPU.

Every row of a micro-batch reads the step's shared prefix (a 5k-token prompt of tool schemas): attending over
`cat(prefix.expand(rows), own)` copies the prefix's keys and values once per row and per query head (GQA), forward
and replay, and sums their gradients back, while the products are the same whatever the layout. Here, as in the
engine's cascade attention (rollout/cascade.py), all rows' queries of a KV head attend to the one prefix together,
each row attends to its own tokens under its mask, and the two partial softmaxes are merged through their
log-sum-exp.

The backward pass needs no gradient of the log-sum-exp: with `w` the prefix's share of each query's softmax mass
and `out` the merged output, the part over keys `i` gets `w_i * d_out` as its output gradient and `out` as its
output, so that the fused kernel's `rowsum(d_out_i * out) = w_i * rowsum(d_out * out)` is the full softmax's term:
each part's score gradient `w_i * P_i * (d_out V_i^T - rowsum(d_out * out))` is then the one attention over all
keys at once would give.
"""

from __future__ import annotations

import torch

_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _together(x: torch.Tensor) -> torch.Tensor:
    """[b, kv, m, ...] -> [1, kv, b * m, ...]: every row's queries of a KV head in one batch."""
    rows, kv = x.shape[:2]
    return x.transpose(0, 1).reshape(1, kv, rows * x.shape[2], *x.shape[3:])


def _apart(x: torch.Tensor, rows: int) -> torch.Tensor:
    """The inverse of `_together`."""
    kv = x.shape[1]
    return x.reshape(kv, rows, -1, *x.shape[3:]).transpose(0, 1)


class _Cascade(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grouped, key, value, mask, prefix_key, prefix_value, scale):
        rows = grouped.shape[0]
        out_p, lse_p = _forward(_together(grouped), prefix_key, prefix_value, 0.0, False, scale=scale)
        out_s, lse_s = _forward(grouped, key, value, 0.0, False, attn_mask=mask, scale=scale)
        lse_p = _apart(lse_p, rows)
        share = torch.sigmoid(lse_p - lse_s)[..., None]  # the prefix's share of each query's softmax mass
        out = torch.lerp(out_s, _apart(out_p, rows), share).contiguous()
        ctx.save_for_backward(grouped, key, value, mask, prefix_key, prefix_value, out, lse_p, lse_s, share)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        grouped, key, value, mask, prefix_key, prefix_value, out, lse_p, lse_s, share = ctx.saved_tensors
        rows, scale = grouped.shape[0], ctx.scale
        d_out = d_out.contiguous()
        d_prefix = d_out * share
        dq_s, dk_s, dv_s = _backward(
            d_out - d_prefix, grouped, key, value, out, lse_s, 0.0, False, attn_mask=mask, scale=scale
        )
        dq_p, dk_p, dv_p = _backward(
            _together(d_prefix),
            _together(grouped),
            prefix_key,
            prefix_value,
            _together(out),
            _together(lse_p).contiguous(),
            0.0,
            False,
            scale=scale,
        )
        return dq_s + _apart(dq_p, rows), dk_s, dv_s, None, dk_p, dv_p, None


def cascade_with_grad(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    prefix_key: torch.Tensor,
    prefix_value: torch.Tensor,
) -> torch.Tensor:
    """Attention of `query` [b, heads, q, d] over the prefix `prefix_key`/`prefix_value` [1, kv_heads, n, d] (every
    row sees all of it) and each row's own `key`/`value` [b, kv_heads, s, d] under the additive `mask` [b, 1, q, s]
    (no query masked everywhere), differentiable in all five tensors. Returns [b, q, heads, d]. CPU only (the
    fused flash kernel returns the log-sum-exp the merge needs)."""
    rows, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    grouped = query.reshape(rows, kv_heads, groups * width, dim)  # query head h reads KV head h // groups
    mask = mask[:, :, None].expand(rows, 1, groups, width, mask.shape[-1]).reshape(rows, 1, groups * width, -1)
    out = _Cascade.apply(
        grouped, key.contiguous(), value.contiguous(), mask.contiguous(), prefix_key.contiguous(),
        prefix_value.contiguous(), scale,
    )  # fmt: skip
    return out.reshape(rows, kv_heads, groups, width, dim).permute(0, 3, 1, 2, 4).reshape(rows, width, heads, dim)
