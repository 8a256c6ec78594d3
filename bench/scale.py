"""Benchmark: data parallel on this CPU. The same one GRPO step of the calculator recipe on the default model
(4 prompts x 4 samples) in one process and under `torchrun --nproc-per-node 2` (FSDP2, gloo): step time and
the largest difference between the two runs' updated weights, for full weights and LoRA.
Prints a table and writes bench/results/scale.json.

Not measured here: the hf against the vllm engine for a whole training step (the vllm engine cannot train
yet: issue 17).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine, write_results

ROOT = Path(__file__).parents[1]


def run(out: Path, name: str, ranks: int, lora: bool) -> dict:
    overrides = [
        "train.steps=1", "train.prompts_per_step=4", "train.group_size=4", "rollout.max_new_tokens=48",
        "eval.at_start=false", "eval.at_end=false", f"output_dir={out}", f"run_name={name}", "train.lr=1e-5",
        *(["train.lora.r=16"] if lora else []),
    ]  # fmt: skip
    args = [a for o in overrides for a in ("--set", o)]
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
        if ranks > 1
        else [sys.executable]
    )
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // ranks))}
    done = subprocess.run([*launcher, "-m", "toolrl", "train", *args], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    metrics = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()][-1]
    return {"step_s": round(metrics["step_s"], 1), "rollout_s": round(metrics["rollout_s"], 1),
            "train_s": round(metrics["train_s"], 1), "reward": metrics["reward"]}  # fmt: skip


def max_abs_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(str(a / "final" / "model.safetensors")), load_file(str(b / "final" / "model.safetensors"))
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/scale.json")
    args = parser.parse_args()
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for kind, lora in (("full", False), ("lora", True)):
            one, two = run(out, f"{kind}-1", 1, lora), run(out, f"{kind}-2", 2, lora)
            diff = max_abs_diff(out / f"{kind}-1", out / f"{kind}-2")
            result[kind] = {"ranks1": one, "ranks2": two, "ranks2_vs_ranks1_max_abs_weight_diff": diff}
            print(f"{kind}: 1 rank {one['step_s']} s, 2 ranks {two['step_s']} s, max |weight diff| {diff:.2e}")
    result["vllm_sync_max_abs_logprob_diff"] = None  # the vllm engine cannot train yet (issue 17)
    workload = {"recipe": "calculator (packaged default)", "prompts_per_step": 4, "group_size": 4, "lr": 1e-5}
    write_results(args.out, {"machine": machine(), "workload": workload, **result})


if __name__ == "__main__":
    main()
