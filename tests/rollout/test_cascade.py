"""Cascade attention (a shared prefix read once, each row's suffix from its slot) against plain attention."""

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from toolrl.models import native
from toolrl.models.native import attention as long_prompt
from toolrl.rollout.cascade import SharedPrefix, attend_with_lse, attend_with_lse_reference, cascade_attention


class Layer(torch.nn.Module):
    layer_idx = 0


@pytest.mark.parametrize("width", [1, 5])
def test_cascade_equals_attention_over_prefix_and_suffix(width):
    torch.manual_seed(0)
    rows, heads, kv_heads, dim, prefix, suffix = 3, 6, 2, 8, 11, 7
    query = torch.randn(rows, heads, width, dim)
    shared_k, shared_v = torch.randn(1, kv_heads, prefix, dim), torch.randn(1, kv_heads, prefix, dim)
    own_k, own_v = torch.randn(rows, kv_heads, suffix, dim), torch.randn(rows, kv_heads, suffix, dim)
    # Row r's queries sit at suffix positions 2 + r ..., causal within the suffix; the last row is padding
    # (sees none of its suffix), as a row of a decode step with nothing to do.
    allowed = torch.zeros(rows, 1, width, suffix, dtype=torch.bool)
    for r in range(rows - 1):
        for q in range(width):
            allowed[r, 0, q, : 2 + r + q + 1] = True
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    shared = SharedPrefix(list(range(prefix)), [shared_k], [shared_v])

    out, _ = cascade_attention(Layer(), query, own_k, own_v, mask, scaling=dim**-0.5, shared_prefix=shared)

    full_k = torch.cat([shared_k.expand(rows, -1, -1, -1), own_k], 2).repeat_interleave(heads // kv_heads, 1)
    full_v = torch.cat([shared_v.expand(rows, -1, -1, -1), own_v], 2).repeat_interleave(heads // kv_heads, 1)
    full_mask = torch.cat([torch.zeros(rows, 1, width, prefix), mask], -1)
    expect = scaled_dot_product_attention(query, full_k, full_v, attn_mask=full_mask).transpose(1, 2)
    assert out.shape == (rows, width, heads, dim)
    assert torch.allclose(out[: rows - 1], expect[: rows - 1], atol=1e-5)
    assert torch.isfinite(out).all()  # the padding row too


def test_the_fused_kernel_and_the_reference_agree_on_output_and_log_sum_exp():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    mask = torch.zeros(2, 1, 4, 9)
    mask[0, 0, :, 5:] = torch.finfo(torch.float32).min
    out, lse = attend_with_lse(q, k, v, mask, 0.3)
    ref_out, ref_lse = attend_with_lse_reference(q, k, v, mask, 0.3)
    assert torch.allclose(out, ref_out, atol=1e-5) and torch.allclose(lse, ref_lse, atol=1e-5)


def test_decode_steps_over_a_long_prefix_read_its_keys_packed_once(monkeypatch):
    """A decode step over a long shared prefix (a prompt of tool schemas) runs its prefix part on the native decode
    kernel, the prefix's keys packed at the first step and kept with it; every step gives plain attention's output."""
    try:
        native.load()
    except native.KernelUnavailable as exc:
        pytest.skip(f"the native kernel cannot be built here: {exc}")
    generator = torch.Generator().manual_seed(2)
    rows, heads, kv_heads, dim, prefix, suffix = 4, 6, 2, 64, 1100, 5
    shared_k, shared_v = (torch.randn(1, prefix, kv_heads, dim, generator=generator).transpose(1, 2) for _ in "kv")
    shared = SharedPrefix(list(range(prefix)), [shared_k], [shared_v])
    packs, decodes = [], []
    pack, decode = long_prompt.pack_keys, long_prompt.decode_forward
    monkeypatch.setattr(long_prompt, "pack_keys", lambda *a: packs.append(1) or pack(*a))
    monkeypatch.setattr(long_prompt, "decode_forward", lambda *a: decodes.append(1) or decode(*a))
    for step in range(3):
        query = torch.randn(rows, heads, 1, dim, generator=generator)
        own_k, own_v = (torch.randn(rows, kv_heads, suffix + step, dim, generator=generator) for _ in "kv")
        mask = torch.zeros(rows, 1, 1, suffix + step)
        with torch.no_grad():
            out, _ = cascade_attention(Layer(), query, own_k, own_v, mask, scaling=dim**-0.5, shared_prefix=shared)
        full_k = torch.cat([shared_k.expand(rows, -1, -1, -1), own_k], 2).repeat_interleave(heads // kv_heads, 1)
        full_v = torch.cat([shared_v.expand(rows, -1, -1, -1), own_v], 2).repeat_interleave(heads // kv_heads, 1)
        expect = scaled_dot_product_attention(query, full_k, full_v).transpose(1, 2)
        torch.testing.assert_close(out, expect, atol=2e-6, rtol=1e-5)
    assert len(decodes) == 3 and len(packs) == 1  # each step on the kernel, the keys packed once
    assert list(shared.packed) == [0]
