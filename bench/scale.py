"""Benchmark: data parallel on this CPU. The same one GRPO step of the calculator recipe on the default model
(4 prompts x 4 samples) in one process and under `torchrun --nproc-per-node 2` (FSDP2, gloo): step time and
the largest difference between the two runs' updated weights, for full weights and LoRA.
Prints a table and writes bench/results/scale.json.

Also one-step off-policy (train.async_steps: 1) against on-policy, 3 steps each of the same work in one
process: the mean seconds of steps 2 and 3 (step 1 has no rollout to overlap with) and their mean staleness.
On 2 cores the rollout and the update compete for the same cores, so no gain is expected here.

The hf against the vllm engine for a whole training step, and the weight sync's log-prob difference, are
measured by bench/vllm_train.py from vLLM's own venv (it adds its keys to scale.json).
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


def run(out: Path, name: str, ranks: int, lora: bool, *extra: str, steps: int = 1) -> dict:
    overrides = [
        f"train.steps={steps}", "train.prompts_per_step=4", "train.group_size=4", "rollout.max_new_tokens=48",
        "eval.at_start=false", "eval.at_end=false", f"output_dir={out}", f"run_name={name}", "train.lr=1e-5",
        *(["train.lora.r=16"] if lora else []), *extra,
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
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    later = records[1:] or records  # after the first step
    mean = lambda key: round(sum(r.get(key, 0.0) for r in later) / len(later), 2)  # noqa: E731
    return {"step_s": mean("step_s"), "rollout_s": mean("rollout_s"), "train_s": mean("train_s"),
            "reward": records[-1]["reward"], "staleness": mean("offpolicy/staleness")}  # fmt: skip


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
        on, off = run(out, "sync", 1, False, steps=3), run(out, "async", 1, False, "train.async_steps=1", steps=3)
        result["async_steps"] = {
            "on_policy": on,
            "one_step_off_policy": off,
            "speedup": round(on["step_s"] / off["step_s"], 2),
        }
        print(f"async_steps 1: {off['step_s']} s per step (staleness {off['staleness']}) vs on-policy {on['step_s']} s")
    result["vllm_sync_max_abs_logprob_diff"] = None  # filled in by bench/vllm_train.py, run from vLLM's venv
    workload = {"recipe": "calculator (packaged default)", "prompts_per_step": 4, "group_size": 4, "lr": 1e-5}
    write_results(args.out, {"machine": machine(), "workload": workload, **result})


if __name__ == "__main__":
    main()
