"""Benchmark: the hf-vision engine on this CPU, turns generated together (one left-padded generate) against one
at a time, on a random Qwen2.5-VL and a random LLaVA built from real configs (no small vision-language model
ships for offline use; `--hidden` sets the language model's width), the images environment's tasks (one
224x224 image each: 64 image tokens for Qwen2.5-VL; the tiny LLaVA's CLIP tower sees it at 56x56, 16 tokens),
48 new tokens a turn, seeded.
Prints a table and writes bench/results/vision_engine.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from common import machine, write_results


def measure(model_dir: Path, tasks: int, batched: bool) -> dict:
    from toolrl.config import load_config
    from toolrl.rollout import vision
    from toolrl.train import Workbench

    sets = [
        f"model.name={model_dir}", "env.name=images", "device=cpu", "rollout.max_turns=1",
        "rollout.max_new_tokens=48", "env.options.num_train=64", "env.options.num_test=2",
    ]  # fmt: skip
    bench = Workbench.load(load_config(overrides=sets))
    try:
        rollout = bench.rollout(bench.config.rollout.sampling, seed=0)
        chosen = bench.env.tasks("train")[:tasks]
        vision.MAX_BATCH = 16 if batched else 1
        asyncio.run(rollout.arun(chosen[:1], seed=1))  # warm up
        started = time.perf_counter()
        trajs = asyncio.run(rollout.arun(chosen, seed=2))
        seconds = time.perf_counter() - started
    finally:
        vision.MAX_BATCH = 16
        bench.close()
    generated = sum(sum(t.loss_mask) for t in trajs)
    return {"seconds": round(seconds, 2), "generated_tokens": generated, "tok_per_s": round(generated / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--out", default="bench/results/vision_engine.json")
    args = parser.parse_args()
    from toolrl.models.vision import make_tiny_vlm

    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("qwen2_5_vl", "llava"):
            model = make_tiny_vlm(Path(tmp) / family, family, hidden=args.hidden)
            one = measure(model, args.tasks, batched=False)
            together = measure(model, args.tasks, batched=True)
            speedup = round(together["tok_per_s"] / one["tok_per_s"], 2)
            result[family] = {"one_at_a_time": one, "together": together, "speedup": speedup}
            print(f"{family:<11} one at a time {one['tok_per_s']:>7} tok/s   together {together['tok_per_s']:>7} tok/s"
                  f"   {speedup}x")  # fmt: skip
    workload = {"tasks": args.tasks, "new_tokens_per_turn": 48, "hidden": args.hidden, "image_px": 224}
    write_results(args.out, {"machine": machine(), "workload": workload, **result})


if __name__ == "__main__":
    main()
