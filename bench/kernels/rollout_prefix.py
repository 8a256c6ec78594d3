"""Benchmark: the step's shared prompt computed once for the rollout and the update (scoring/rollout_prefix.py)
against each computing its own (the engine's inference pass, then the update's pass with its graph), in one
process, alternating step by step.

Workloads: `short`, train_vs_trl's GRPO step (the calculator prompts, ~400 tokens before the question, 2 tasks x 8
samples, 64 new tokens, one turn); `long`, long_context's prompt (the support environment with its handbook: ~4.9k
tokens before the customer's first word), 1 task x 8 samples with gradient checkpointing, one turn of 32 new tokens
(the prompt passes do not depend on how much is decoded after them), every other sample rewarded 1 so that every
trajectory enters the loss (as long_context.py's step does). The first step is a warm-up. Per step it
records the seconds in the prompt's passes (the engine's `_compute_prefix_once`, which runs the kept pass when it
is on, and the update's `Scorer.step_prefix`), the rollout, the update and the step, and the process's peak
memory in each phase. Prints a table and writes bench/results/rollout_prefix.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import _parent  # noqa: F401  (bench/ on the import path)
from common import measured_here, save_with_load

WORKLOADS = {
    "short": ["env.name=bench-digits", "env.options.num_train=64", "rollout.max_turns=1", "rollout.max_new_tokens=64",
              "train.prompts_per_step=2", "train.group_size=8", "train.lr=1e-6"],
    "long": ["env.name=support", "env.options.handbook=true", "rollout.max_turns=1", "rollout.max_new_tokens=32",
             "train.prompts_per_step=1", "train.group_size=8", "train.gradient_checkpointing=true"],
}  # fmt: skip


def timed(owner, name: str, into: dict[str, float], key: str) -> None:
    """Add the seconds each call of owner.name takes to into[key] (a benchmark's probe; behaviour unchanged)."""
    call = getattr(owner, name)

    def probe(*args, **kwargs):
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            into[key] = into.get(key, 0.0) + time.perf_counter() - started

    setattr(owner, name, probe)


def run(name: str, steps: int) -> dict:
    import train_vs_trl  # noqa: F401  (registers bench-digits)

    import toolrl.rollout.prefixes as prefixes
    import toolrl.scoring.scorer as scorer
    from toolrl.config import load_config
    from toolrl.memory import meter
    from toolrl.train import Trainer, Workbench

    spent: dict[str, float] = {}
    timed(prefixes.PrefixSharing, "_compute_prefix_once", spent, "rollout_prompt_s")
    lengths: list[int] = []
    compute = prefixes.PrefixSharing._compute_prefix_once
    prefixes.PrefixSharing._compute_prefix_once = lambda self, group, pending, n, read_once: (
        lengths.append(n), compute(self, group, pending, n, read_once))[1]  # fmt: skip
    timed(scorer.Scorer, "plan", spent, "update_prompt_s")
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"output_dir={tmp}", "device=cpu", "eval.at_start=false", "eval.at_end=false"]
        config = load_config(overrides=[*overrides, *WORKLOADS[name], f"train.steps={steps + 1}"])
        bench = Workbench.load(config)
        trainer = Trainer(bench)
        engine, kept = bench.engines["train"], trainer.scorer.kept
        if name == "long":  # the untrained model scores 0 on every task: rewards that differ, so the update trains
            roll_out = trainer.collector.roll_out

            def varied(step):
                part = roll_out(step)
                for i, traj in enumerate(part.trajs):
                    traj.reward = float(i % 2)
                return part

            trainer.collector.roll_out = varied
        rows: dict[str, list[dict]] = {"kept": [], "apart": []}
        for step in range(1, steps + 2):
            way = "kept" if step % 2 == 0 else "apart"
            engine.prefix_pass = kept if way == "kept" else None
            spent.clear()
            metrics = trainer.step(step)
            if step > 1:  # the first is a warm-up
                rows[way].append({
                    **{k: round(v, 3) for k, v in spent.items()},
                    "rollout_s": round(metrics["rollout_s"], 3),
                    "update_s": round(metrics["time/forward_backward_s"], 3),
                    "step_s": round(metrics["step_s"], 3),
                    "generated_tokens": metrics["generated_tokens"],
                    "rollout_peak_gb": round(meter.last["rollout"], 3),
                    "update_peak_gb": round(meter.last["update"], 3),
                })  # fmt: skip
        stats = dict(kept.stats)
        bench.close()
    out = {"prompt_tokens": max(lengths, default=0), "kept_stats": stats, "steps": rows}
    for way, measured in rows.items():
        out[way] = {key: statistics.median(r.get(key, 0.0) for r in measured) for key in measured[0]}
    kept_s, apart_s = (out[w]["rollout_prompt_s"] + out[w]["update_prompt_s"] for w in ("kept", "apart"))
    out["prompt_passes_saved_s"] = apart_s - kept_s
    out["step_speedup"] = out["apart"]["step_s"] / out["kept"]["step_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per workload, alternating, after a warm-up")
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--out", default="bench/results/rollout_prefix.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = {name: run(name, args.steps) for name in args.only or WORKLOADS}
    result = measured_here(load_before, rows)
    print(f"{'workload':>8} {'prompt':>6} {'way':>6} {'rollout prompt':>15} {'update prompt':>14} {'rollout':>8} "
          f"{'update':>7} {'step':>7} {'peak GB (rollout/update)':>25}")  # fmt: skip
    for name, row in rows.items():
        for way in ("apart", "kept"):
            m = row[way]
            print(f"{name:>8} {row['prompt_tokens']:>6} {way:>6} {m['rollout_prompt_s']:>14.2f}s "
                  f"{m['update_prompt_s']:>13.2f}s {m['rollout_s']:>7.2f}s {m['update_s']:>6.2f}s {m['step_s']:>6.2f}s "
                  f"{m['rollout_peak_gb']:>12.2f} / {m['update_peak_gb']:.2f}")  # fmt: skip
        print(f"{name:>8} prompt passes saved {row['prompt_passes_saved_s']:.2f} s a step; "
              f"step {row['step_speedup']:.2f}x (medians)")  # fmt: skip
    save_with_load(args.out, result)


if __name__ == "__main__":
    main()
