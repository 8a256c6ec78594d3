"""Benchmark: the multi-turn `files` environment (recipes/files.yaml) on the default model.

Measures: `replay_success` (an engine that writes every request's reference calls: the tasks and their scoring
are sound when it scores 1.0), `noop_success` (an engine that only replies: 0.0, since every request changes
the tree), and the default model's success on the test split before and after `--steps` GRPO steps of the
recipe, greedy and sampled (temperature 1), with its tool-call, format-error and per-request rates.
Prints a table and writes bench/results/multiturn.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import machine, write_results

from toolrl.config import load_config
from toolrl.rollout.scripted import scripted_engine
from toolrl.train import RunDir, Trainer, Workbench
from toolrl.train.evaluate import breakdown, summarize

RECIPE = Path(__file__).parents[1] / "recipes" / "files.yaml"
KEYS = ("success", "reward/requests", "tool_calls", "format_errors", "tool_errors", "turns")


def oracle_success(bench: Workbench, idle: bool) -> float:
    tasks = bench.env.tasks("test")
    rollout = bench.rollout(bench.config.eval.sampling, seed=0, purpose="oracle")
    rollout.engine = scripted_engine("idle" if idle else "reference", bench.chat, bench.env.syntax, bench.env)
    return summarize(rollout.run(tasks), bench.env.rubric.success)["success"]


def measure(bench: Workbench, temperature: float) -> dict:
    started = time.perf_counter()
    trajs = bench.evaluation(temperature=temperature)
    stats, details = summarize(trajs, bench.env.rubric.success), breakdown(trajs, bench.env.rubric.success)
    row = {key: round(stats[key], 4) for key in KEYS}
    row["by_request"] = {k: round(v["success"], 4) for k, v in details["by_request"].items()}
    row["eval_s"] = round(time.perf_counter() - started, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="bench/results/multiturn.json")
    parser.add_argument("--run-dir", default=f"runs/bench-multiturn-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args()
    overrides = [
        f"train.steps={args.steps}",
        "eval.at_start=false",
        "eval.at_end=false",
        f"run_name={Path(args.run_dir).name}",
    ]
    config = load_config(RECIPE, [*overrides, f"output_dir={Path(args.run_dir).parent}"])
    bench = Workbench.load(config)
    try:
        result = {"replay_success": oracle_success(bench, idle=False), "noop_success": oracle_success(bench, True)}
        print(f"replay {result['replay_success']:.2f}, noop {result['noop_success']:.2f}", flush=True)
        result["before"] = {"greedy": measure(bench, 0.0), "sampled": measure(bench, 1.0)}
        print(f"before: {result['before']}", flush=True)
        started = time.perf_counter()
        run = RunDir.create(config)
        trainer = Trainer(bench, run)
        trainer.train(lambda m: print(f"step {m['step']}: reward {m['reward']:.3f} success {m['success']:.2f}"))
        result["train"] = {"steps": args.steps, "wall_s": round(time.perf_counter() - started, 1), "run": str(run.path)}
        result["after"] = {"greedy": measure(bench, 0.0), "sampled": measure(bench, 1.0)}
    finally:
        bench.close()
    print(f"{'':<18}{'greedy':>10}{'sampled':>10}")
    for when in ("before", "after"):
        for key in KEYS:
            g, s = result[when]["greedy"][key], result[when]["sampled"][key]
            print(f"{when + ' ' + key:<30}{g:>10.3f}{s:>10.3f}")
    print(f"replay_success {result['replay_success']:.2f}  noop_success {result['noop_success']:.2f}")
    tasks = config.eval.num_tasks
    workload = {"recipe": "recipes/files.yaml", "test_tasks": tasks, "train_steps": args.steps}
    write_results(args.out, {"machine": machine(), "workload": workload, **result})


if __name__ == "__main__":
    main()
