"""Benchmark: generation's small-batch products on toolrl's AVX2 kernel (models/native) against oneDNN with its
packed weights (models/linear.py), side by side in one run, alternating.

Three levels, each the median of `--repeats` alternating rounds:
1. one layer's product at the shapes of the default model (rows x in -> out), the weight streamed from memory as
   in a decode step (the product cycles through copies of it totalling `--stream-mb`, more than the caches hold);
2. every product of one decode step of the default model (30 layers x 7 products and the output layer);
3. the engine generating 64 tokens for 16 sequences from the calculator prompts (bench/train_vs_trl.py's
   rollout: 2 tasks x 8 samples), tokens per second with `model.cpu_decode_kernel` native and onednn.
Prints a table and writes bench/results/decode_kernel.json with the machine and its load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import _parent  # noqa: F401  (bench/ on the import path)
import torch
from common import machine, matmul_peak_gflops, timed, write_results

from toolrl.models import load_model, load_tokenizer
from toolrl.models import native as kernel
from toolrl.models.linear import PackedWeights

MODEL = "smollm2-135m-instruct"
SHAPES = [(576, 1536), (1536, 576), (576, 576), (576, 192), (576, 49152)]
ROWS = [1, 8, 16, 32, 64]


def alternate(fns: dict, repeats: int, calls: int) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns."""
    for fn in fns.values():
        fn()  # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(lambda fn=fn: [fn() for _ in range(calls)]) / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def onednn(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def cycling(product, copies: int):
    """A call of `product(i)` on the next of `copies` weights at each call (weights streamed from memory)."""
    turn = [0]

    def call():
        turn[0] = (turn[0] + 1) % copies
        return product(turn[0])

    return call


def products(args) -> list[dict]:
    rows_out = []
    for features, out in SHAPES:
        copies = max(2, int(args.stream_mb * 1e6 // (features * out * 4)))
        weights = [torch.randn(out, features) * 0.05 for _ in range(copies)]
        ours = [kernel.NativeWeight(w, rows=max(ROWS)) for w in weights]  # above max_rows() too: where it loses
        theirs = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]
        for rows in ROWS:
            x = torch.randn(rows, features)
            fns = {
                "native": cycling(lambda i, x=x, ours=ours: ours[i](x), copies),
                "onednn": cycling(lambda i, x=x, theirs=theirs: onednn(x, theirs[i]), copies),
            }
            err = (ours[0](x) - torch.nn.functional.linear(x, weights[0])).abs().max().item()
            s = alternate(fns, args.repeats, max(4, copies))
            row = {"rows": rows, "in": features, "out": out, "native_us": s["native"] * 1e6,
                   "onednn_us": s["onednn"] * 1e6, "speedup": s["onednn"] / s["native"], "max_abs_diff": err,
                   "native_gb_s": features * out * 4 / s["native"] / 1e9,
                   "native_gflops": 2 * rows * features * out / s["native"] / 1e9}  # fmt: skip
            rows_out.append(row)
            print(f"{rows:>4} x {features:>5} -> {out:>5}  native {row['native_us']:8.0f} us  oneDNN "
                  f"{row['onednn_us']:8.0f} us  {row['speedup']:4.2f}x  ({row['native_gb_s']:4.1f} GB/s)",
                  flush=True)  # fmt: skip
    return rows_out


def model_step(args, model) -> list[dict]:
    """Every product of a decode step of `rows` sequences, on each kernel's copies."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    out = []
    for rows in (8, 16, 32):
        inputs = {f: torch.randn(rows, f) for f in {layer.in_features for layer in layers}}
        fns = {}
        for name, native in (("native", True), ("onednn", False)):
            packed = PackedWeights(model, native=native)

            def run(packed=packed, inputs=inputs):
                with torch.inference_mode(), packed.active():
                    for layer in layers:
                        layer(inputs[layer.in_features])

            fns[name] = run
        s = alternate(fns, args.repeats, 2)
        out.append({"rows": rows, "native_ms": s["native"] * 1e3, "onednn_ms": s["onednn"] * 1e3,
                    "speedup": s["onednn"] / s["native"]})  # fmt: skip
        print(f"decode step's products, {rows} rows: native {s['native'] * 1e3:.1f} ms, oneDNN "
              f"{s['onednn'] * 1e3:.1f} ms: {s['onednn'] / s['native']:.2f}x", flush=True)  # fmt: skip
    return out


def generation(args, model) -> dict:
    from train_vs_trl import prompts

    from toolrl.chat import ChatFormat
    from toolrl.rollout import HFEngine, SamplingParams

    tokenizer = load_tokenizer(MODEL)
    chat = ChatFormat(tokenizer)
    tasks = prompts(tokenizer, 2)
    engines = {k: HFEngine(model, chat.stop_ids, tokenizer.pad_token_id, torch.device("cpu"), tokenizer=tokenizer,
                           decode_kernel=k) for k in ("native", "onednn")}  # fmt: skip
    rates = {k: [] for k in engines}

    def rollout(engine, tag) -> float:
        async def run():
            # each sequence's own seed: both kernels draw the same tokens while their values agree
            outs = await asyncio.gather(*(engine.generate((tag, i), tasks[i // 8], SamplingParams(
                1.0, max_new_tokens=args.tokens, seed=i)) for i in range(16)))  # fmt: skip
            for i in range(16):
                engine.release((tag, i))
            engine.free_memory()
            return sum(len(o.ids) for o in outs)

        started = time.perf_counter()
        tokens = asyncio.run(run())
        return tokens / (time.perf_counter() - started)

    for name, engine in engines.items():
        rollout(engine, f"warm-{name}")
    for r in range(args.repeats):
        for name, engine in engines.items():
            rates[name].append(rollout(engine, f"{name}-{r}"))
    for engine in engines.values():
        engine.close()
    result = {k: statistics.median(v) for k, v in rates.items()}
    result["speedup"] = result["native"] / result["onednn"]
    print(f"generation, 16 x {args.tokens} tokens: native {result['native']:.1f} tok/s, oneDNN "
          f"{result['onednn']:.1f} tok/s: {result['speedup']:.2f}x", flush=True)  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stream-mb", type=float, default=256.0, help="copies of each weight, in all")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default="bench/results/decode_kernel.json")
    args = parser.parse_args()
    kernel.load()  # fails here, with why, where the kernel cannot be built
    torch.manual_seed(0)
    load_before = os.getloadavg()
    result = {"machine": machine(), "threads": torch.get_num_threads(), "max_rows": kernel.max_rows()}
    result["products"] = products(args)
    model = load_model(MODEL, torch.device("cpu")).eval()
    result["decode_step"] = model_step(args, model)
    result["generation"] = generation(args, model)
    result["matmul_peak_gflops"] = round(matmul_peak_gflops(), 1)
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    write_results(args.out, result)
    print(f"wrote {args.out} (load {load_before[0]:.1f} -> {result['load_average']['after'][0]:.1f})")


if __name__ == "__main__":
    main()
