"""Benchmark: attention at a real-size prompt (4,879 tokens, the handbook environment's shared prompt) on this CPU,
the kernel the hf engine uses against the alternatives tried, at the default model's shapes (9 query heads, 3 KV
heads, head size 64, 30 layers). Side by side in one process, taking turns, the best of `--repeats` each:

- prefill: torch's causal flash kernel (what `scaled_dot_product_attention` runs on CPU) against causal attention
  in chunks of query rows as oneDNN products with the softmax in place;
- decode over the shared prefix (8 sequences: 24 query rows per KV head, rollout/cascade.py): the flash kernel
  with its log-sum-exp against oneDNN products on keys and values packed once, and a batched matmul on keys stored
  transposed;
- a decode step's linear layers (8 rows through the model's weights, packed as the engine packs them) against the
  read bandwidth measured in the same process (MKL against oneDNN per product: bench/kernels/linear_kernels.py).

Every alternative's output is checked against the flash kernel's. Prints a table and writes
bench/results/attention_kernels.json with the machine's load average."""

from __future__ import annotations

import argparse
import os

import _parent  # noqa: F401  (bench/ on the import path)
import torch
import torch.nn.functional as F
from common import ROOT, machine, side_by_side, write_results

from toolrl.rollout.cascade import attend_with_lse

TOKENS, HEADS, KV_HEADS, DIM, LAYERS, BATCH = 4879, 9, 3, 64, 30, 8
GROUPS = HEADS // KV_HEADS
LINEAR = torch.ops.mkldnn._linear_pointwise


def chunked_causal(q, k, v, chunk: int) -> torch.Tensor:
    """Causal GQA attention [1, heads, n, d], `chunk` query positions at a time: for each KV head the chunk's rows
    of its query heads times every key up to the chunk's end (one oneDNN product), the diagonal block masked."""
    n = q.shape[2]
    grouped = q.view(1, KV_HEADS, GROUPS, n, DIM)
    out = torch.empty(1, KV_HEADS, GROUPS, n, DIM)
    upper = torch.full((chunk, chunk), float("-inf")).triu_(1)
    for h in range(KV_HEADS):
        keys, values = k[0, h], v[0, h]
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            rows = end - start
            scores = LINEAR(grouped[0, h, :, start:end].reshape(GROUPS * rows, DIM), keys[:end], None, "none", [], "")
            scores.mul_(DIM**-0.5).view(GROUPS, rows, end)[:, :, start:end].add_(upper[:rows, :rows])
            scores.sub_(scores.amax(-1, keepdim=True)).exp_()
            total = scores.sum(-1, keepdim=True)
            out[0, h, :, start:end] = (
                LINEAR(scores, values[:end].t(), None, "none", [], "").div_(total).view(GROUPS, rows, DIM)
            )
    return out.view(1, HEADS, n, DIM)


def prefill(repeats: int) -> dict:
    q = torch.randn(1, HEADS, TOKENS, DIM)
    k, v = torch.randn(1, KV_HEADS, TOKENS, DIM), torch.randn(1, KV_HEADS, TOKENS, DIM)
    flops = 2 * 2 * HEADS * DIM * TOKENS * TOKENS / 2
    flash = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    reference = flash()
    ways = {"flash": flash} | {f"chunked_{c}": lambda c=c: chunked_causal(q, k, v, c) for c in (128, 256, 512)}
    errors = {name: (way() - reference).abs().max().item() for name, way in ways.items() if name != "flash"}
    rows = side_by_side(ways, repeats)
    return {"layer_ms": {k: round(s * 1000, 1) for k, s in rows.items()},
            "gflops": {k: round(flops / s / 1e9, 1) for k, s in rows.items()}, "max_error": errors}  # fmt: skip


def decode_prefix(repeats: int) -> dict:
    keys = [torch.randn(1, KV_HEADS, TOKENS, DIM) for _ in range(LAYERS)]
    values = [torch.randn(1, KV_HEADS, TOKENS, DIM) for _ in range(LAYERS)]
    query = torch.randn(1, KV_HEADS, BATCH * GROUPS, DIM)
    scale = DIM**-0.5
    packed_k = [[torch.ops.mkldnn._reorder_linear_weight(k[0, h].contiguous()) for h in range(KV_HEADS)] for k in keys]
    packed_v = [[torch.ops.mkldnn._reorder_linear_weight(v[0, h].t().contiguous()) for h in range(KV_HEADS)]
                for v in values]  # fmt: skip
    transposed = [k.transpose(-1, -2).contiguous() for k in keys]

    def onednn(layer):
        outs, lses = [], []
        for h in range(KV_HEADS):
            scores = LINEAR(query[0, h], packed_k[layer][h], None, "none", [], "").mul_(scale)
            lse = torch.logsumexp(scores, -1)
            outs.append(LINEAR(scores.sub_(lse[:, None]).exp_(), packed_v[layer][h], None, "none", [], ""))
            lses.append(lse)
        return torch.stack(outs)[None], torch.stack(lses)[None]

    def bmm(layer):
        scores = torch.matmul(query, transposed[layer]).mul_(scale)
        lse = torch.logsumexp(scores, -1)
        return torch.matmul(scores.sub_(lse[..., None]).exp_(), values[layer]), lse

    flash = lambda layer: attend_with_lse(query, keys[layer], values[layer], None, scale)  # noqa: E731
    ways = {"flash": flash, "onednn_packed": onednn, "bmm_transposed": bmm}
    reference = flash(0)[0]
    errors = {name: (way(0)[0] - reference).abs().max().item() for name, way in ways.items() if name != "flash"}
    every_layer = {name: lambda w=way: [w(layer) for layer in range(LAYERS)] for name, way in ways.items()}
    rows = side_by_side(every_layer, repeats)
    return {"step_ms": {k: round(s * 1000, 1) for k, s in rows.items()}, "max_error": errors}


def decode_linear(repeats: int) -> dict:
    """One decode step's linear layers at batch 8 (the model's q/k/v/o, gate/up/down and output layer shapes, packed
    weights) against reading the same bytes."""
    shapes = [(576, 576)] * 2 * LAYERS + [(192, 576)] * 2 * LAYERS + [(1536, 576)] * 2 * LAYERS
    shapes += [(576, 1536)] * LAYERS + [(49152, 576)]
    weights = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(*s)) for s in shapes]
    inputs = {576: torch.randn(BATCH, 576), 1536: torch.randn(BATCH, 1536)}
    weight_bytes = sum(o * i * 4 for o, i in shapes)
    layers = [(inputs[i], w) for (_, i), w in zip(shapes, weights, strict=True)]
    big = torch.randn(weight_bytes // 4)
    times = side_by_side(
        {"step": lambda: [LINEAR(x, w, None, "none", [], "") for x, w in layers], "read": big.sum}, repeats
    )
    step, read = times["step"], times["read"]
    return {"decode_linear_ms": round(step * 1000, 1), "decode_linear_gb_s": round(weight_bytes / step / 1e9, 1),
            "read_gb_s": round(weight_bytes / read / 1e9, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention_kernels.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    with torch.inference_mode():
        result = {"decode_linear": decode_linear(args.repeats), "prefill": prefill(args.repeats),
                  "decode_prefix": decode_prefix(args.repeats)}  # fmt: skip
    result |= {"machine": {**machine(), "torch_threads": torch.get_num_threads()},
               "load_avg_before": [round(x, 2) for x in load_before],
               "load_avg_after": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    p, pre, dec = result["decode_linear"], result["prefill"], result["decode_prefix"]
    print(f"decode linear layers at batch {BATCH}: {p['decode_linear_ms']} ms ({p['decode_linear_gb_s']} GB/s of "
          f"weights; read {p['read_gb_s']} GB/s)")  # fmt: skip
    print(f"prefill attention, {TOKENS} tokens, one layer:")
    for name, ms in pre["layer_ms"].items():
        print(f"  {name:<16}{ms:>9.1f} ms {pre['gflops'][name]:>7.1f} GFLOP/s")
    print(f"decode over the shared prefix, batch {BATCH}, {LAYERS} layers:")
    for name, ms in dec["step_ms"].items():
        print(f"  {name:<16}{ms:>9.1f} ms a step")
    write_results(args.out, result)
    print(args.out)


if __name__ == "__main__":
    main()
