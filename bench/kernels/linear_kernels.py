"""Benchmark: the default model's linear layers on torch's CPU kernel (MKL) against oneDNN (models/linear.py).

Side by side in one run, alternating, the best of `--repeats` each: (1) the products of one layer at the shapes a
decode step and a training step give it (rows x in x out), (2) the whole default model: an inference forward of
8 x 64 tokens, a decode step of 32 sequences after a 405-token prompt (the engine's, with its cache; on oneDNN
with the engine's packed weights and without them), and a training forward + backward of 8 x 256 tokens.
Results agree to fp32 rounding (the largest differences are printed). Prints a table and writes
bench/results/linear_kernels.json.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import _parent  # noqa: F401  (bench/ on the import path)
import torch
from common import machine, matmul_peak_gflops, write_results

from toolrl.models import load_model
from toolrl.models.linear import use_onednn_linear, use_torch_linear

MODEL = "smollm2-135m-instruct"
SHAPES = [(1, 576, 1536), (16, 576, 1536), (16, 1536, 576), (16, 576, 49152), (32, 576, 576), (4096, 576, 1536),
          (4096, 1536, 576), (4096, 576, 49152)]  # fmt: skip


def best(fn, repeats: int) -> float:
    fn()  # warm-up: oneDNN builds its primitive for the shape once
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def products(repeats: int) -> list[dict]:
    rows = []
    for m, k, n in SHAPES:
        layer = torch.nn.Linear(k, n, bias=False)
        x = torch.randn(m, k)
        times = {"torch": [], "onednn": []}
        with torch.inference_mode():
            expected = layer(x)
            for _ in range(2):
                for kernel in times:
                    (use_onednn_linear if kernel == "onednn" else use_torch_linear)(torch.nn.Sequential(layer))
                    inner = max(1, int(2e8 // (m * k * n)))  # small products: many calls per timing

                    def call(layer=layer, x=x, inner=inner):
                        for _ in range(inner):
                            layer(x)

                    times[kernel].append(best(call, repeats) / inner)
            diff = (layer(x) - expected).abs().max().item()
        flop = 2 * m * k * n
        row = {"rows": m, "in": k, "out": n, "max_abs_diff": diff}
        for kernel, seen in times.items():
            row[f"{kernel}_gflops"] = round(flop / min(seen) / 1e9, 1)
        row["onednn_vs_torch"] = round(row["onednn_gflops"] / row["torch_gflops"], 2)
        rows.append(row)
        print(f"{m:>5} x {k:>4} x {n:>5}: torch {row['torch_gflops']:6.1f} GFLOP/s  oneDNN "
              f"{row['onednn_gflops']:6.1f}  {row['onednn_vs_torch']:.2f}x")  # fmt: skip
    return rows


def decode_step_s(model, prompt: list[int], batch: int, tokens: int, pack: bool = True) -> float:
    """Seconds per decode step of `batch` sequences (the HF engine, temperature 1): a run of `tokens` new
    tokens minus a run of one, over tokens - 1."""
    from toolrl.rollout import HFEngine, SamplingParams

    engine = HFEngine(model, [], 0, torch.device("cpu"), pack_weights=pack)

    def run(n: int, tag: str) -> float:
        async def go():
            params = SamplingParams(1.0, max_new_tokens=n)
            await asyncio.gather(*(engine.generate((tag, i), prompt + [i], params) for i in range(batch)))
            for i in range(batch):
                engine.release((tag, i))

        started = time.perf_counter()
        asyncio.run(go())
        return time.perf_counter() - started

    run(2, "warm")
    one, many = run(1, "one"), run(tokens, "many")
    engine.close()
    return (many - one) / (tokens - 1)


def whole_model(repeats: int) -> dict:
    model = load_model(MODEL, torch.device("cpu"), cpu_linear="torch")
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (8, 256))
    prompt = torch.randint(0, model.config.vocab_size, (405,)).tolist()

    def forward():
        with torch.inference_mode():
            return model(input_ids=ids[:, :64]).logits

    def train_step():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids).logits.logsumexp(-1).mean()
        loss.backward()
        return loss.item()

    seen = {kernel: {"forward_s": [], "decode_step_s": [], "train_step_s": []} for kernel in ("torch", "onednn")}
    outputs, unpacked = {}, []
    for round_ in range(repeats):
        for kernel in ("torch", "onednn") if round_ % 2 == 0 else ("onednn", "torch"):
            (use_onednn_linear if kernel == "onednn" else use_torch_linear)(model)
            model.eval()
            started = time.perf_counter()
            logits = forward()
            seen[kernel]["forward_s"].append(time.perf_counter() - started)
            seen[kernel]["decode_step_s"].append(decode_step_s(model, prompt, 32, 9))
            if kernel == "onednn":
                unpacked.append(decode_step_s(model, prompt, 32, 9, pack=False))
            model.train()
            started = time.perf_counter()
            loss = train_step()
            seen[kernel]["train_step_s"].append(time.perf_counter() - started)
            grad = model.model.layers[3].mlp.up_proj.weight.grad.clone()
            outputs.setdefault(kernel, (logits, loss, grad))
            print(f"round {round_ + 1}, {kernel:>6}: " + "  ".join(f"{k} {v[-1]:.2f}" for k, v in seen[kernel].items()))
    (l0, loss0, g0), (l1, loss1, g1) = outputs["torch"], outputs["onednn"]
    result = {
        kernel: {k: round(min(v), 3) for k, v in times.items()} for kernel, times in seen.items()
    }  # fmt: skip
    result["torch_vs_onednn"] = {k: round(result["torch"][k] / result["onednn"][k], 2) for k in result["torch"]}
    result["onednn_unpacked_decode_step_s"] = round(min(unpacked), 3)
    result["packed_vs_unpacked_decode"] = round(min(unpacked) / result["onednn"]["decode_step_s"], 2)
    result["logits_max_abs_diff"] = (l0 - l1).abs().max().item()
    result["loss_abs_diff"] = abs(loss0 - loss1)
    result["grad_relative_diff"] = ((g0 - g1).norm() / g0.norm()).item()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/linear_kernels.json")
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    rows = products(args.repeats)
    model = whole_model(args.repeats)
    print("\n| work | torch s | oneDNN s | torch / oneDNN |\n|---|---:|---:|---:|")
    for key, label in [("forward_s", "inference forward, 8 x 64 tokens"),
                       ("decode_step_s", "decode step, 32 sequences after 405 tokens"),
                       ("train_step_s", "training forward + backward, 8 x 256 tokens")]:  # fmt: skip
        print(f"| {label} | {model['torch'][key]} | {model['onednn'][key]} | {model['torch_vs_onednn'][key]} |")
    print(f"decode step on oneDNN without packed weights: {model['onednn_unpacked_decode_step_s']} s; packed "
          f"{model['packed_vs_unpacked_decode']}x faster")  # fmt: skip
    print(f"differences: logits {model['logits_max_abs_diff']:.1e}, loss {model['loss_abs_diff']:.1e}, "
          f"gradient {model['grad_relative_diff']:.1e} relative")  # fmt: skip
    peak = matmul_peak_gflops()
    write_results(
        args.out,
        {"machine": machine(), "threads": torch.get_num_threads(), "model": MODEL, "products": rows,
         "whole_model": model, "matmul_peak_gflops": round(peak, 1)},
    )  # fmt: skip


if __name__ == "__main__":
    main()
