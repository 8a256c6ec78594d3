"""Benchmark: the update's work on a long prompt, each piece this change moved against what ran before, side by
side in one process, taking turns, the best of `--repeats` each:

- a layer's causal self-attention over the handbook environment's 4,879-token shared prompt (9 query heads, 3 KV
  heads, head size 64), forward and backward from a given output gradient: the native kernel
  (models/native/flash.c) against PyTorch's CPU flash kernels;
- the update's cascade (scoring/cascade_grad.py): 8 rows x 64 tokens of each query head reading the whole prompt,
  forward with the log-sum-exp and backward, the same two;
- a linear layer's weight gradient at 4,879 rows (models/linear.py `weight_grad`): MKL reading the gradient
  transposed against oneDNN after a transposing copy;
- the SwiGLU feed-forward's elementwise backward at 4,879 x 1,536 (models/fused.py): the native pass
  (models/native/elementwise.c) against PyTorch's ops;
- a decode step's attention over the shared prompt (8 rows, 3 query heads per KV head: 24 queries a KV head), as
  30 layers in a row with the caches emptied first (in a step the weights and other layers' keys pass through
  between two reads of a layer's keys): the native decode kernel (flash.c `toolrl_flash_decode`, the keys packed
  once per rollout) against PyTorch's CPU flash kernel;
- the rollout of bench/long_context.py's step: milliseconds a decode step, with the decode kernel on and off in
  turn;
- bench/long_context.py's GRPO step (1 task x 8 samples, 3 turns x 64 tokens, gradient checkpointing): the
  rollout's prompt pass (the shared prompt through the policy in training mode, as scoring/rollout_prefix.py runs it)
  and the update, on the same trajectories, with all of the above on ("native") and off ("before") in turn (each
  update computes its own prompt pass here, where the step's update reads the rollout's).

Every new result is checked against the old one. FLOP rates count attention's causal half once (backward: 2.5x the
forward's products). Prints a table and writes bench/results/long_prompt_kernels.json with the machine's matmul
peak and load average."""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from contextlib import contextmanager

import _parent  # noqa: F401  (bench/ on the import path)
import torch
from common import ROOT, matmul_peak_gflops, measured_here, side_by_side, timed, write_results

from toolrl.models.native import attention as long_prompt

TOKENS, HEADS, KV_HEADS, DIM, ROWS = 4879, 9, 3, 64, 8 * 64
FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def hf_layout(heads: int, n: int, seed: int) -> torch.Tensor:
    """[1, heads, n, d] as a Llama layer hands it over: a transposed view of [1, n, heads, d]."""
    return torch.randn(1, n, heads, DIM, generator=torch.Generator().manual_seed(seed)).transpose(1, 2)


def rates(times: dict[str, float], flops: float) -> dict:
    return {name: {"ms": round(s * 1000, 1), "gflops": round(flops / s / 1e9, 1)} for name, s in times.items()}


def causal(repeats: int) -> dict:
    q, k, v = hf_layout(HEADS, TOKENS, 0), hf_layout(KV_HEADS, TOKENS, 1), hf_layout(KV_HEADS, TOKENS, 2)
    d_out = torch.randn(1, TOKENS, HEADS, DIM)
    scale = DIM**-0.5
    flops = 2 * 2 * HEADS * DIM * TOKENS * (TOKENS + 1) / 2
    out, lse = FLASH(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), 0.0, True, scale=scale)
    native_out = long_prompt.causal_attention(q, k, v, scale)
    error = (native_out - out.transpose(1, 2)).abs().max().item()
    forward = side_by_side({"pytorch": lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True), "native": lambda: long_prompt.causal_attention(q, k, v, scale)},
        repeats)  # fmt: skip

    def pytorch_backward():  # GQA as SDPA's backward runs it: the KV heads repeated, their gradients summed
        kk, vv = (x.repeat_interleave(3, 1) for x in (k, v))
        dq, dk, dv = FLASH_BACKWARD(d_out.transpose(1, 2), q, kk, vv, out, lse, 0.0, True, scale=scale)
        return dq, dk.view(1, KV_HEADS, 3, TOKENS, DIM).sum(2), dv.view(1, KV_HEADS, 3, TOKENS, DIM).sum(2)

    lse_native = long_prompt._forward(q[0], k[0], v[0], 0, scale, torch.empty(HEADS, TOKENS, DIM))

    def native_backward():
        return long_prompt._backward(d_out[0].transpose(0, 1), q[0], k[0], v[0], native_out[0].transpose(0, 1),
                                     lse_native, 0, scale)  # fmt: skip

    grad_error = max((a.squeeze(0) - b.squeeze(0)).abs().max().item()
                     for a, b in zip(native_backward(), pytorch_backward(), strict=True))  # fmt: skip
    backward = side_by_side({"pytorch": pytorch_backward, "native": native_backward}, repeats)
    return {"forward": rates(forward, flops), "backward": rates(backward, 2.5 * flops),
            "max_error": error, "max_grad_error": grad_error}  # fmt: skip


def cascade_prefix(repeats: int) -> dict:
    """Every row's queries of a KV head together ([1, kv_heads, rows x groups, d]) over the whole prompt."""
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, KV_HEADS, ROWS * 3, DIM, generator=generator)
    k, v = (torch.randn(1, KV_HEADS, TOKENS, DIM, generator=generator) for _ in range(2))
    d_out = torch.randn(1, KV_HEADS, ROWS * 3, DIM, generator=generator)
    scale, flops = DIM**-0.5, 2 * 2 * KV_HEADS * ROWS * 3 * DIM * TOKENS
    out, lse = FLASH(q, k, v, 0.0, False, scale=scale)
    native_out, native_lse = long_prompt.prefix_forward(q, k, v, scale)
    error = max((native_out - out).abs().max().item(), (native_lse - lse).abs().max().item())
    forward = side_by_side({"pytorch": lambda: FLASH(q, k, v, 0.0, False, scale=scale),
                            "native": lambda: long_prompt.prefix_forward(q, k, v, scale)}, repeats)  # fmt: skip
    backward = side_by_side({
        "pytorch": lambda: FLASH_BACKWARD(d_out, q, k, v, out, lse, 0.0, False, scale=scale),
        "native": lambda: long_prompt.prefix_backward(d_out, q, k, v, out, lse, scale)}, repeats)  # fmt: skip
    return {"forward": rates(forward, flops), "backward": rates(backward, 2.5 * flops), "max_error": error}


def decode_attention(repeats: int) -> dict:
    """30 layers' prefix part of a decode step, each layer's keys and values [1, 3, 4879, 64] in a layer's layout,
    24 queries a KV head, the caches emptied before each pass: ms a layer, the median of 5 x `repeats` passes."""
    layers, generator = 30, torch.Generator().manual_seed(8)
    queries = [torch.randn(1, KV_HEADS, 24, DIM, generator=generator) for _ in range(layers)]
    keys = [hf_layout(KV_HEADS, TOKENS, 10 + i) for i in range(layers)]
    values = [hf_layout(KV_HEADS, TOKENS, 50 + i) for i in range(layers)]
    packed = [long_prompt.pack_keys(k) for k in keys]  # once per rollout, as the shared prefix keeps them
    scale, flops = DIM**-0.5, 2 * 2 * KV_HEADS * 24 * DIM * TOKENS
    evict = torch.empty(128 * 1024 * 1024)  # 512 MB: more than the caches

    def pytorch(i):
        return FLASH(queries[i], keys[i], values[i], 0.0, False, scale=scale)[:2]

    def native(i):
        return long_prompt.decode_forward(queries[i], packed[i], values[i], scale)

    error = max((a - b).abs().max().item() for a, b in zip(pytorch(0), native(0), strict=True))
    passes: dict[str, list[float]] = {"pytorch": [], "native": []}
    for _ in range(5 * repeats):  # in turn, the caches emptied before each pass (not timed)
        for name, one in (("pytorch", pytorch), ("native", native)):
            evict.fill_(1.0)
            started = time.perf_counter()
            for i in range(layers):
                one(i)
            passes[name].append((time.perf_counter() - started) / layers)
    times = {name: sorted(t)[len(t) // 2] for name, t in passes.items()}  # the median pass
    pack_s = min(timed(lambda: long_prompt.pack_keys(keys[0])) for _ in range(repeats))
    return rates(times, flops) | {"max_error": error, "pack_keys_ms_per_layer": round(pack_s * 1000, 2)}


def weight_grads(repeats: int) -> dict:
    """grad^T @ x for the default model's layer shapes at the prompt's rows: (in, out) -> times."""
    from toolrl.models.linear import _onednn

    rows = {}
    for inner, outer in ((576, 1536), (1536, 576), (576, 576)):
        generator = torch.Generator().manual_seed(inner + outer)
        grad, x = torch.randn(TOKENS, outer, generator=generator), torch.randn(TOKENS, inner, generator=generator)
        ways = {"before": lambda g=grad, x=x: _onednn(g.t(), x.t(), None),  # what _LinearFunction ran
                "native": lambda g=grad, x=x: torch.mm(g.t(), x)}  # fmt: skip
        error = (ways["native"]() - ways["before"]()).abs().max().item()
        times = side_by_side(ways, repeats)
        rows[f"{inner}x{outer}"] = rates(times, 2 * TOKENS * inner * outer) | {"max_error": error}
    return rows


def swiglu_backward(repeats: int) -> dict:
    """The product and both gradients of silu(gate) * up from the product's gradient, [1, 4879, 1536]."""
    from toolrl.models import fused

    generator = torch.Generator().manual_seed(7)
    grad, gate, up = (torch.randn(1, TOKENS, 1536, generator=generator) for _ in range(3))

    def before():
        return fused._silu_mul(gate, up), *fused._swiglu_grads_torch(grad, gate, up, True, True)

    def native():
        return fused._native_swiglu(grad, gate, up, (True, True, True))

    error = max((a - b).abs().max().item() for a, b in zip(native(), before(), strict=True))
    times = side_by_side({"before": before, "native": native}, repeats)
    return {name: {"ms": round(s * 1000, 1)} for name, s in times.items()} | {"max_error": error}


@contextmanager
def switched(on: bool):
    """This change's pieces on, or off (what ran before it)."""
    from toolrl.models import fused, linear

    saved = long_prompt.ENABLED, fused._native_swiglu, linear._mkl_full_speed
    if not on:
        long_prompt.ENABLED, fused._native_swiglu, linear._mkl_full_speed = False, lambda *a: None, lambda: False
    try:
        yield
    finally:
        long_prompt.ENABLED, fused._native_swiglu, linear._mkl_full_speed = saved


def rollout(repeats: int) -> dict:
    """bench/long_context.py's rollout (1 task x 8 samples), the decode kernel on and off in turn: ms a decode step
    (the engine's `_decode` calls timed) and the prompt's prefill, each the best of `repeats` rollouts."""
    from long_context import GROUP, config

    from toolrl.rollout.hf import HFEngine
    from toolrl.train import Trainer, Workbench

    timing = {"decode": [0.0, 0], "prefill": [0.0, 0]}
    real = {name: getattr(HFEngine, f"_{name}") for name in timing}

    def timed(name):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return real[name](*args, **kwargs)
            finally:
                timing[name][0] += time.perf_counter() - started
                timing[name][1] += 1

        return call

    extra = ["train.prompts_per_step=1", f"train.group_size={GROUP}", "train.gradient_checkpointing=true"]
    per_step: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        bench = Workbench.load(config(tmp, extra))
        trainer, engine = Trainer(bench), bench.engine("train", 0)
        trainer.collector.roll_out(1)  # the first builds what is built once
        engine.free_memory()
        try:
            for name in timing:
                setattr(HFEngine, f"_{name}", timed(name))
            for _ in range(repeats):
                for on in (True, False):
                    saved, long_prompt.ENABLED = long_prompt.ENABLED, on
                    for entry in timing.values():
                        entry[:] = [0.0, 0]
                    try:
                        trainer.collector.roll_out(1)
                    finally:
                        long_prompt.ENABLED = saved
                        engine.free_memory()
                    key = "native" if on else "before"
                    per_step.setdefault(f"decode_ms_{key}", []).append(1000 * timing["decode"][0] / timing["decode"][1])
                    per_step.setdefault(f"prefill_s_{key}", []).append(timing["prefill"][0])
                    print(f"  rollout {key}: {per_step[f'decode_ms_{key}'][-1]:.1f} ms a decode step "
                          f"({timing['decode'][1]} steps)", flush=True)  # fmt: skip
        finally:
            for name, fn in real.items():
                setattr(HFEngine, f"_{name}", fn)
            bench.close()
    return {"best": {k: round(min(v), 2) for k, v in per_step.items()},
            "all": {k: [round(x, 2) for x in v] for k, v in per_step.items()}}  # fmt: skip


def step(repeats: int) -> dict:
    from long_context import GROUP, config

    from toolrl.scoring import StepPrefix
    from toolrl.train import Trainer, Workbench

    extra = ["train.prompts_per_step=1", f"train.group_size={GROUP}", "train.gradient_checkpointing=true"]
    with tempfile.TemporaryDirectory() as tmp:
        bench = Workbench.load(config(tmp, extra))
        trainer = Trainer(bench)
        trajs = trainer.collector.roll_out(1).trajs
        bench.engine("train", 0).free_memory()
        for i, traj in enumerate(trajs):  # every trajectory enters the loss
            traj.reward = float(i % 2)
        prompt = trajs[0].token_ids[: trajs[0].loss_mask.index(1)]
        model = trainer.model

        def prompt_pass():
            model.train()
            StepPrefix(model, prompt)

        times: dict[str, list[float]] = {}
        for _ in range(repeats):
            for native in (True, False):
                update = lambda: trainer.update(copy.deepcopy(trajs))  # noqa: E731
                for name, fn in (("prompt_pass", prompt_pass), ("update", update)):
                    key = f"{name}_{'native' if native else 'before'}"
                    with switched(native):
                        started = time.perf_counter()
                        fn()
                        times.setdefault(key, []).append(time.perf_counter() - started)
                    print(f"  {key}: {times[key][-1]:.1f} s", flush=True)
        bench.close()
    best = {name: round(min(t), 2) for name, t in times.items()}
    return {"seconds": best, "all_seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
            "prompt_tokens": len(prompt), "tokens": [len(t.token_ids) for t in trajs]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-repeats", type=int, default=2, help="pairs of prompt passes and updates")
    parser.add_argument("--skip-step", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "long_prompt_kernels.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    peak = matmul_peak_gflops()
    rows = {"causal": causal(args.repeats), "cascade_prefix": cascade_prefix(args.repeats),
            "decode_attention": decode_attention(args.repeats), "weight_grad": weight_grads(args.repeats),
            "swiglu_backward": swiglu_backward(args.repeats)}  # fmt: skip
    table = [(f"{name} {part}", rows[name][part]) for name in ("causal", "cascade_prefix")
             for part in ("forward", "backward")]  # fmt: skip
    table += [("decode_attention (a layer)", rows["decode_attention"])]
    table += [(f"weight_grad {shape}", row) for shape, row in rows["weight_grad"].items()]
    table += [("swiglu_backward", rows["swiglu_backward"])]
    for label, row in table:
        before, ours = row.get("pytorch", row.get("before")), row["native"]
        row["ratio"] = round(before["ms"] / ours["ms"], 2)
        print(f"{label:27}: before {before['ms']:7.1f} ms   native {ours['ms']:7.1f} ms   {row['ratio']:.2f}x")
    if not args.skip_step:
        rows["rollout"] = rollout(args.step_repeats)
        best = rows["rollout"]["best"]
        rows["rollout"]["decode_ratio"] = round(best["decode_ms_before"] / best["decode_ms_native"], 2)
        print(f"rollout decode step  : before {best['decode_ms_before']:6.1f} ms   native "
              f"{best['decode_ms_native']:6.1f} ms   {rows['rollout']['decode_ratio']:.2f}x")  # fmt: skip
        rows["step"] = step(args.step_repeats)
        s = rows["step"]["seconds"]
        for name in ("prompt_pass", "update"):
            ratio = round(s[f"{name}_before"] / s[f"{name}_native"], 2)
            rows["step"][f"{name}_ratio"] = ratio
            print(f"step {name:11}: before {s[f'{name}_before']:6.1f} s   native {s[f'{name}_native']:6.1f} s   "
                  f"{ratio:.2f}x")  # fmt: skip
    result = measured_here(load_before, {"before_matmul_peak_gflops": round(peak, 1), **rows})
    print(f"matmul peak {peak:.0f} GFLOP/s; load average before {result['load_avg_before']}, after "
          f"{result['load_avg_after']}")  # fmt: skip
    write_results(args.out, result)


if __name__ == "__main__":
    main()
